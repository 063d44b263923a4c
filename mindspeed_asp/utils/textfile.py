"""Reading text inputs (datasets, histories, configs, cost files, summaries) as strict UTF-8.

A file in another encoding, or a binary file given by mistake, is refused with the file, the line and the
byte that is not UTF-8, instead of a UnicodeDecodeError traceback from deep inside a reader.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Type, Union

from mindspeed_asp.errors import InputError

PathLike = Union[str, Path]


def decode_utf8(data: bytes, path: PathLike, line: Optional[int] = None, key: Optional[str] = None,
                error: Type[InputError] = InputError) -> str:
    """`data` decoded as UTF-8; on failure an `error` (InputError or a subclass) naming `path` and the line of
    the bad byte (counted in `data`, or `line` when `data` is that one line)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        where = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        raise error(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {exc.start - start + 1}); "
                         "save the file as UTF-8", path=str(path), line=where, key=key) from None


def read_text(path: PathLike, key: Optional[str] = None, error: Type[InputError] = InputError) -> str:
    """The whole file as text, refusing bytes that are not UTF-8 (see `decode_utf8`)."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise error("is a directory, not a file", path=str(path), key=key) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}", path=str(path), key=key) from None
    return decode_utf8(data, path, key=key, error=error)
