"""Put on PYTHONPATH by the fault tests: in every process of ``pipesched train`` (the launcher
and its ranks), the faults the environment asks for, at known points of the run:

- ``PIPESCHED_TEST_FULL_DISK_STEP=N``: writing any file of the checkpoint of step N fails as a
  full disk does (``OSError(ENOSPC)`` from the stream DCP opens);
- ``PIPESCHED_TEST_DISK_FILLS_AT_STEP=N``: the disk fills while the checkpoint of step N is
  written: the streams DCP opens take small writes (a buffer holds them) and fail larger ones with
  ENOSPC, as a full disk does (torch's writer then says "unexpected pos");
- ``PIPESCHED_TEST_FULL_DISK_UNDER=DIR``: every output written atomically under DIR fails so;
- ``PIPESCHED_TEST_REMOVE_AFTER_RUN=DIR``: DIR is removed once training returns, before the
  outputs are written (a folder removed during the run);
- ``PIPESCHED_TEST_FULL_DISK_TENSORBOARD=N``: TensorBoard's event file takes its first N records,
  then every write fails as a full disk does (in the writer's own thread, as a real one fails).
"""

import errno
import os

FULL_DISK_STEP = os.environ.get("PIPESCHED_TEST_FULL_DISK_STEP")
DISK_FILLS_AT_STEP = os.environ.get("PIPESCHED_TEST_DISK_FILLS_AT_STEP")
FULL_DISK_UNDER = os.environ.get("PIPESCHED_TEST_FULL_DISK_UNDER")
REMOVE_AFTER_RUN = os.environ.get("PIPESCHED_TEST_REMOVE_AFTER_RUN")
FULL_DISK_TENSORBOARD = os.environ.get("PIPESCHED_TEST_FULL_DISK_TENSORBOARD")


def _full_disk(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


if FULL_DISK_STEP:
    from contextlib import contextmanager

    from torch.distributed.checkpoint.filesystem import FileSystem

    original_stream = FileSystem.create_stream
    marker = f"step-{int(FULL_DISK_STEP):06d}"

    @contextmanager
    def failing_stream(self, path, mode):
        if "w" in mode and marker in str(path):
            raise _full_disk(path)
        with original_stream(self, path, mode) as stream:
            yield stream

    FileSystem.create_stream = failing_stream

if DISK_FILLS_AT_STEP:
    from contextlib import contextmanager

    from torch.distributed.checkpoint.filesystem import FileSystem

    original_open = FileSystem.create_stream
    filling = f"step-{int(DISK_FILLS_AT_STEP):06d}"

    class FillingStream:
        """Small writes stay in the buffer (they succeed); one that reaches the disk fails."""

        def __init__(self, stream, path):
            self.stream, self.path = stream, path

        def write(self, data):
            if len(data) > 1024:
                raise _full_disk(self.path)
            return self.stream.write(data)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    @contextmanager
    def filling_stream(self, path, mode):
        with original_open(self, path, mode) as stream:
            yield FillingStream(stream, path) if "w" in mode and filling in str(path) else stream

    FileSystem.create_stream = filling_stream

if FULL_DISK_UNDER:
    from pipesched import outfiles

    original_write = outfiles.write_atomic

    def failing_write(path, data):
        if os.path.abspath(path).startswith(os.path.abspath(FULL_DISK_UNDER) + os.sep):
            raise _full_disk(path)
        return original_write(path, data)

    outfiles.write_atomic = failing_write

if REMOVE_AFTER_RUN:
    import shutil

    from pipesched.training import train

    original_run = train.run

    def run_then_remove(cfg):
        result = original_run(cfg)
        shutil.rmtree(REMOVE_AFTER_RUN)
        return result

    train.run = run_then_remove

if FULL_DISK_TENSORBOARD:
    from tensorboard.summary.writer.record_writer import RecordWriter

    original_record = RecordWriter.write
    records = []

    def filling_record(self, data):
        records.append(len(data))
        if len(records) > int(FULL_DISK_TENSORBOARD):
            raise _full_disk("events.out.tfevents")
        return original_record(self, data)

    RecordWriter.write = filling_record
