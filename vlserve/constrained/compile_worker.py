"""The compile worker process: `python -m vlserve.constrained.compile_worker`.

It reads jobs from stdin and writes replies to stdout, one frame each (an 8-byte length, then a
pickle). A job is (kind, text, max_states); a reply is ("ok", (regex, ByteDFA)),
("too_large", message, reason), ("invalid", message) or ("error", message). The first frame it
writes is ("ready",), once its imports are done. A separate process (not a thread) so that a compile
past its time limit can be killed, and so its Python-level work never holds the engine's GIL.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import BinaryIO

_HEADER = struct.Struct("<Q")


def write_frame(stream: BinaryIO, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO):
    """The next frame, or EOFError when the other side has gone."""
    header = _read_exactly(stream, _HEADER.size)
    return pickle.loads(_read_exactly(stream, _HEADER.unpack(header)[0]))


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the stream ended inside a frame" if chunks else "the stream ended")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _reply(job) -> tuple:
    from vlserve.constrained.byte_compile import ConstraintTooLarge, compile_to_byte_dfa
    from vlserve.core.errors import ConstraintError

    try:
        return ("ok", compile_to_byte_dfa(*job))
    except ConstraintTooLarge as e:
        return ("too_large", str(e), e.reason)
    except ConstraintError as e:
        return ("invalid", str(e))
    except Exception as e:  # a bug, not the request's fault: the parent reports it as one
        return ("error", f"{type(e).__name__}: {e}")


def main() -> None:
    # Frames go to a private copy of stdout; anything printed by imported code goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    jobs = sys.stdin.buffer
    import vlserve.constrained.byte_compile  # noqa: F401  (the imports, before saying ready)

    write_frame(out, ("ready",))
    while True:
        try:
            job = read_frame(jobs)
        except EOFError:
            return
        write_frame(out, _reply(job))


if __name__ == "__main__":
    main()
