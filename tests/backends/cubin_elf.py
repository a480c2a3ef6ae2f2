"""Reading a cubin (an ELF64 image) without a GPU or a toolkit: its sections and its kernels' names."""

from __future__ import annotations

import struct

_SHT_SYMTAB = 2
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10


def _headers(blob: bytes):
    assert blob[:4] == b"\x7fELF" and blob[4] == 2, "not an ELF64 image"
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, align, entsize)
    return [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)], shstrndx


def _string(blob: bytes, table, offset: int) -> str:
    start = table[4] + offset
    return blob[start:blob.index(b"\0", start)].decode()


def sections(blob: bytes) -> dict[str, bytes]:
    """Section name -> its bytes."""
    headers, names = _headers(blob)
    return {_string(blob, headers[names], h[0]): blob[h[4]:h[4] + h[5]] for h in headers}


def entry_points(blob: bytes) -> set[str]:
    """The kernels (``__global__`` functions: FUNC symbols marked as CUDA entries) the image defines."""
    headers, _ = _headers(blob)
    found = set()
    for h in headers:
        if h[1] != _SHT_SYMTAB:
            continue
        strings = headers[h[6]]
        for offset in range(h[4], h[4] + h[5], 24):
            name, info, other, _, _, _ = struct.unpack_from("<IBBHQQ", blob, offset)
            if info & 0xF == _STT_FUNC and other & _STO_CUDA_ENTRY:
                found.add(_string(blob, strings, name))
    return found
