"""Checking a GGUF header before anything trusts it.

A GGUF file is a header, then the tensor bytes:

    magic "GGUF" · version (u32) · tensor count (u64) · key/value count (u64)
    key/value pairs:  key (string) · value type (u32) · value
    tensor infos:     name (string) · n_dims (u32) · dims (u64 each, innermost first)
                      · ggml type (u32) · offset (u64, from the start of the data section)
    padding to ``general.alignment`` (32 by default), then the data section

A string is its byte length (u64) then its bytes; an array is its item type (u32), its
length (u64), then its items. Everything is little-endian.

``gguf.GGUFReader`` believes the counts it reads: a corrupted array length makes it loop (and
allocate) for as long as the number says. ``check_header`` walks the same bytes first, only
reading lengths, and refuses, in one ``CheckpointError`` line, any count or size that does not
fit in the bytes left, an unknown value or tensor type, a name that is not UTF-8, a duplicate,
or a tensor whose bytes lie past the end of the file. The work it does is bounded by the file
size, and it allocates nothing in proportion to a number it read.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from glassformer.errors import CheckpointError

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays; llama.cpp writes none

# GGUF value types: the fixed-size ones and their sizes in bytes; 8 = string, 9 = array.
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header declares it (checked to lie inside the file)."""

    name: str
    dims: tuple[int, ...]  # innermost first, as ggml writes them
    ggml_type: int
    start: int  # absolute byte offset in the file
    nbytes: int


def check_header(path: Path, block_sizes: dict[int, tuple[int, int]]) -> list[TensorInfo]:
    """Walk the header of the GGUF file ``path`` and refuse anything that does not fit.

    Args:
        path: the file.
        block_sizes: ggml type → (elements per block, bytes per block), for every type the
            caller knows (``gguf.GGML_QUANT_SIZES``); another type is refused here.

    Returns:
        The tensor infos, in file order.

    Raises:
        CheckpointError: one line saying what is wrong and where (without the path: the
            caller names the file).
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise CheckpointError(f"not a GGUF file: {size} bytes, truncated")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _Walker(buf, size).walk(block_sizes)
    except OSError as e:
        raise CheckpointError(f"cannot read it: {e.strerror or e}") from None


class _Walker:
    """A cursor over the header that refuses to step past the end."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 0

    def fail(self, problem: str) -> CheckpointError:
        return CheckpointError(problem)

    def take(self, n: int, what: str) -> int:
        """Step over ``n`` bytes; their start."""
        if n > self.size - self.pos:
            raise self.fail(
                f"truncated or corrupt GGUF header: {what} at byte {self.pos} needs {n} bytes, "
                f"{self.size - self.pos} are left"
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def u32(self, what: str) -> int:
        return int(struct.unpack_from("<I", self.buf, self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack_from("<Q", self.buf, self.take(8, what))[0])

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        start = self.take(n, what)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {start} is not UTF-8") from None

    def walk(self, block_sizes: dict[int, tuple[int, int]]) -> list[TensorInfo]:
        if self.buf[:4] != GGUF_MAGIC:
            raise self.fail(f"not a GGUF file (it starts with {bytes(self.buf[:4])!r})")
        self.take(4, "the magic")
        version = self.u32("the version")
        if version not in VERSIONS:
            raise self.fail(f"GGUF version {version} (little-endian); this reads {VERSIONS}")
        tensor_count = self.u64("the tensor count")
        kv_count = self.u64("the key/value count")
        # Each key/value takes at least 13 bytes, each tensor info at least 24.
        self.fits(kv_count, 13, "key/value pairs")
        alignment = DEFAULT_ALIGNMENT
        keys: set[str] = set()
        for _ in range(kv_count):
            key = self.string("a metadata key")
            if key in keys:
                raise self.fail(f"the metadata key {key!r} appears twice")
            keys.add(key)
            vtype = self.u32(f"the type of {key!r}")
            if key == "general.alignment":
                if vtype != UINT32:
                    raise self.fail("general.alignment is not a uint32")
                alignment = self.u32("general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    raise self.fail(f"general.alignment {alignment} is not a power of two")
            else:
                self.skip_value(vtype, key, depth=0)
        self.fits(tensor_count, 24, "tensor infos")
        declared = [self.tensor_info(block_sizes) for _ in range(tensor_count)]
        names = [name for name, *_ in declared]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise self.fail(f"the tensor {dup!r} appears twice")
        data_start = -(-self.pos // alignment) * alignment
        infos = []
        for name, dims, ggml_type, offset, nbytes in declared:
            start = data_start + offset
            if start + nbytes > self.size:
                raise self.fail(
                    f"tensor {name!r} declares bytes {start}..{start + nbytes}, past the end "
                    f"of the file ({self.size} bytes): truncated or corrupt"
                )
            infos.append(TensorInfo(name, dims, ggml_type, start, nbytes))
        return infos

    def fits(self, count: int, min_size: int, what: str) -> None:
        if count * min_size > self.size - self.pos:
            raise self.fail(
                f"the header declares {count} {what}, more than the {self.size - self.pos} "
                "bytes left can hold: truncated or corrupt"
            )

    def skip_value(self, vtype: int, key: str, depth: int) -> None:
        if vtype in SCALAR_SIZES:
            self.take(SCALAR_SIZES[vtype], f"the value of {key!r}")
        elif vtype == STRING:
            self.take(self.u64(f"the length of {key!r}"), f"the value of {key!r}")
        elif vtype == ARRAY and depth < MAX_NESTING:
            item_type = self.u32(f"the item type of {key!r}")
            count = self.u64(f"the length of {key!r}")
            if item_type in SCALAR_SIZES:
                self.take(count * SCALAR_SIZES[item_type], f"the items of {key!r}")
                return
            if item_type not in (STRING, ARRAY):
                raise self.fail(f"{key!r} is an array of unknown value type {item_type}")
            self.fits(count, 8 if item_type == STRING else 12, f"items in {key!r}")
            for _ in range(count):
                self.skip_value(item_type, key, depth + 1)
        else:
            raise self.fail(f"{key!r} has unknown value type {vtype}")

    def tensor_info(
        self, block_sizes: dict[int, tuple[int, int]]
    ) -> tuple[str, tuple[int, ...], int, int, int]:
        name = self.string("a tensor name")
        n_dims = self.u32(f"the rank of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dimensions; ggml allows 1..{MAX_DIMS}")
        dims = tuple(self.u64(f"the shape of {name!r}") for _ in range(n_dims))
        ggml_type = self.u32(f"the type of {name!r}")
        offset = self.u64(f"the offset of {name!r}")
        if ggml_type not in block_sizes:
            raise self.fail(f"tensor {name!r} has unknown ggml type {ggml_type}")
        block, block_bytes = block_sizes[ggml_type]
        if min(dims) < 1 or dims[0] % block:
            raise self.fail(
                f"tensor {name!r} has shape {list(dims)}; its type needs positive sizes and "
                f"rows a multiple of {block}"
            )
        n = 1
        for d in dims:
            n *= d
        nbytes = n // block * block_bytes
        if nbytes > self.size:
            raise self.fail(
                f"tensor {name!r} declares {nbytes} bytes, more than the file's {self.size}"
            )
        return name, dims, ggml_type, offset, nbytes
