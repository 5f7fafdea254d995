"""Training data as users have it, read in bounded memory: token files (:mod:`.token_files`),
text through a tokenizer (:mod:`.text_documents`, :mod:`.tokenize_text`), windows of a token
stream per step (:mod:`.streams`), how a window's documents see each other (:mod:`.packing`). ``tiny_text.txt`` beside them is the text pipesched ships."""
