"""Reading a GGUF header, checked, before anything trusts it.

A GGUF file is a header, then the tensor bytes:

    magic "GGUF" · version (u32) · tensor count (u64) · key/value count (u64)
    key/value pairs:  key (string) · value type (u32) · value
    tensor infos:     name (string) · n_dims (u32) · dims (u64 each, innermost first)
                      · ggml type (u32) · offset (u64, from the start of the data section)
    padding to ``general.alignment`` (32 by default), then the data section

A string is its byte length (u64) then its bytes; an array is its item type (u32), its
length (u64), then its items. Everything is little-endian.

``read_header`` walks these bytes once and refuses, in one ``CheckpointError`` line, any
count or size that does not fit in the bytes left, an unknown value or tensor type, a name
that is not UTF-8, a duplicate, a tensor whose bytes lie past the end of the file, and two
tensors that share bytes (llama.cpp requires each tensor to start where the one before it
ends; sharing bytes would let a small file declare many large tensors). It reads lengths and
the small fixed-size values only: a string or an array stays where it is in the file (a
``Field``) until someone asks for it (``read_value``), so an array nobody reads costs one pass
over its lengths, and nothing is allocated in proportion to a number read. The file is read,
never memory-mapped: a file truncated meanwhile is a short read, refused in one line, where a
memory map would kill the process with SIGBUS.

A command reads a file's weights, its tokenizer and its blocks: the parsed header is kept
per (file, size, modification time) so the header is walked once (``read_header``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

from glassformer.errors import CheckpointError, shown

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays; llama.cpp writes none
MAX_NAME = 1024  # bytes in a key or a tensor name (ggml's own limit is 64)
MAX_ENTRIES = 1 << 16  # keys, and tensors (real files: some 40 keys, a few thousand tensors)
CHUNK = 1 << 20  # bytes read at a time while walking

# GGUF value types: the fixed-size ones as struct formats; 8 = string, 9 = array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}  # fmt: skip
SCALAR_SIZES = {t: struct.calcsize(f) for t, f in SCALARS.items()}
STRING, ARRAY, UINT32 = 8, 9, 4
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Field:
    """One metadata value: a scalar read already, or where a string or array lies."""

    vtype: int
    start: int  # its first byte (a string's text, an array's first item)
    end: int  # past its last byte
    scalar: Any = None  # the value of a fixed-size type
    item_type: int | None = None  # an array's
    count: int = 0  # an array's items


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header declares it (checked to lie inside the file, alone)."""

    name: str
    dims: tuple[int, ...]  # innermost first, as ggml writes them
    ggml_type: int
    start: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class Header:
    """A checked GGUF header: its metadata fields by key and its tensors in file order."""

    size: int
    fields: dict[str, Field]
    tensors: tuple[TensorInfo, ...]


_CACHE: dict[tuple, Header] = {}
_CACHE_SIZE = 4


def read_header(path: Path, block_sizes: dict[int, tuple[int, int]]) -> Header:
    """The checked header of the GGUF file ``path`` (walked once per version of the file).

    Args:
        path: the file.
        block_sizes: ggml type → (elements per block, bytes per block), for every type the
            caller knows (``gguf.GGML_QUANT_SIZES``); another type is refused here.

    Raises:
        CheckpointError: one line saying what is wrong and where (without the path: the
            caller names the file).
    """
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, tuple(block_sizes.items()))
            if key not in _CACHE:
                if st.st_size < 24:
                    raise CheckpointError(f"not a GGUF file: {st.st_size} bytes, truncated")
                header = _Walker(f, st.st_size).walk(block_sizes)
                while len(_CACHE) >= _CACHE_SIZE:
                    del _CACHE[next(iter(_CACHE))]
                _CACHE[key] = header
            return _CACHE[key]
    except OSError as e:
        raise CheckpointError(f"cannot read it: {e.strerror or e}") from None


def read_span(f: BufferedReader, start: int, nbytes: int, what: str) -> bytearray:
    """The ``nbytes`` bytes at ``start`` (checked to lie inside the file by ``read_header``);
    a short read (the file shrank since) is one line."""
    f.seek(start)
    data = bytearray(nbytes)
    if f.readinto(data) != nbytes:
        raise CheckpointError(f"{what} is cut short: the file changed after its header was read")
    return data


class _Walker:
    """A cursor over the header that refuses to step past the end; it reads the file a chunk
    at a time into ``buf`` (the bytes from ``base`` on) and seeks over what it skips."""

    def __init__(self, f: BufferedReader, size: int) -> None:
        self.f, self.size, self.pos = f, size, 0
        self.buf, self.base = b"", 0

    def take(self, n: int, what: str) -> int:
        """Step over ``n`` bytes; their start."""
        if n > self.size - self.pos:
            raise CheckpointError(
                f"truncated or corrupt GGUF header: {what} at byte {self.pos} needs {n} bytes, "
                f"{self.size - self.pos} are left"
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def fill(self, n: int, what: str) -> int:
        """Have the ``n`` bytes at the cursor in ``buf``; where they start in it."""
        if n > self.size - self.pos:
            self.take(n, what)  # refuses
        at = self.pos - self.base
        if at < 0 or at + n > len(self.buf):
            self.f.seek(self.pos)
            self.buf, self.base, at = self.f.read(max(n, CHUNK)), self.pos, 0
            if len(self.buf) < n:
                raise CheckpointError(f"{what} is cut short: the file changed while being read")
        return at

    def read(self, n: int, what: str) -> int:
        """Step over ``n`` bytes, having them in ``buf``; where they start in ``buf``."""
        at = self.fill(n, what)
        self.take(n, what)
        return at

    def skip_strings(self, count: int, what: str) -> None:
        """Step over ``count`` strings (an array's items) in a tight loop over their lengths:
        a million empty strings take a fraction of a second."""
        left = count
        while left:
            at, end = self.fill(8, what), len(self.buf) - 8
            while left and at <= end:
                at += 8 + _U64.unpack_from(self.buf, at)[0]
                left -= 1
            self.pos = self.base + at
            if self.pos > self.size:
                raise CheckpointError(
                    f"truncated or corrupt GGUF header: a string in {what} runs past the end "
                    f"of the file ({self.size} bytes)"
                )

    def scalar(self, vtype: int, what: str) -> Any:
        at = self.read(SCALAR_SIZES[vtype], what)  # (may load another chunk into buf)
        return struct.unpack_from(SCALARS[vtype], self.buf, at)[0]

    def u32(self, what: str) -> int:
        return int(self.scalar(UINT32, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(10, what))

    def name(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        if n > MAX_NAME:
            raise CheckpointError(
                f"{what} at byte {self.pos} is {n} bytes long (at most {MAX_NAME})"
            )
        at = self.read(n, what)
        try:
            return self.buf[at : at + n].decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{what} at byte {self.pos - n} is not UTF-8") from None

    def fits(self, count: int, min_size: int, what: str) -> None:
        if count * min_size > self.size - self.pos:
            raise CheckpointError(
                f"the header declares {count} {what}, more than the {self.size - self.pos} "
                "bytes left can hold: truncated or corrupt"
            )

    def walk(self, block_sizes: dict[int, tuple[int, int]]) -> Header:
        at = self.read(4, "the magic")
        magic = bytes(self.buf[at : at + 4])
        if magic != GGUF_MAGIC:
            raise CheckpointError(f"not a GGUF file (it starts with {magic!r})")
        version = self.u32("the version")
        if version not in VERSIONS:
            raise CheckpointError(f"GGUF version {version} (little-endian); this reads {VERSIONS}")
        tensor_count = self.u64("the tensor count")
        kv_count = self.u64("the key/value count")
        if max(tensor_count, kv_count) > MAX_ENTRIES:  # each kept as an object, ~10x its bytes
            raise CheckpointError(
                f"the header declares {tensor_count} tensors and {kv_count} keys; glassformer "
                f"reads at most {MAX_ENTRIES} of each"
            )
        self.fits(kv_count, 13, "key/value pairs")  # each takes at least 13 bytes
        fields: dict[str, Field] = {}
        for _ in range(kv_count):
            key = self.name("a metadata key")
            if key in fields:
                raise CheckpointError(f"the metadata key {shown(key)} appears twice")
            label = shown(key)  # the key as messages show it (it may be 1 KB of anything)
            fields[key] = self.field(self.u32(f"the type of {label}"), label, depth=0)
        alignment = _alignment(fields.get("general.alignment"))
        self.fits(tensor_count, 24, "tensor infos")  # each takes at least 24 bytes
        declared: dict[str, tuple[tuple[int, ...], int, int, int]] = {}
        for _ in range(tensor_count):
            name, *info = self.tensor_info(block_sizes)
            if name in declared:
                raise CheckpointError(f"the tensor {shown(name)} appears twice")
            declared[name] = tuple(info)  # type: ignore[assignment]
        data_start = -(-self.pos // alignment) * alignment
        tensors = tuple(
            TensorInfo(name, dims, kind, data_start + offset, nbytes)
            for name, (dims, kind, offset, nbytes) in declared.items()
        )
        _check_placement(tensors, self.size)
        return Header(self.size, fields, tensors)

    def field(self, vtype: int, key: str, depth: int) -> Field:
        """The value of type ``vtype`` at the cursor, stepped over (``key``: its key, as
        messages show it)."""
        if vtype in SCALARS:
            start = self.pos
            value = self.scalar(vtype, f"the value of {key}")
            return Field(vtype, start, self.pos, scalar=value)
        if vtype == STRING:
            n = self.u64(f"the length of {key}")
            start = self.take(n, f"the value of {key}")
            return Field(vtype, start, self.pos)
        if vtype == ARRAY and depth < MAX_NESTING:
            item_type = self.u32(f"the item type of {key}")
            count = self.u64(f"the length of {key}")
            start = self.pos
            if item_type in SCALARS:
                self.take(count * SCALAR_SIZES[item_type], f"the items of {key}")
            elif item_type == STRING:
                self.fits(count, 8, f"items in {key}")
                self.skip_strings(count, key)
            elif item_type == ARRAY:
                self.fits(count, 12, f"items in {key}")
                for _ in range(count):
                    self.field(item_type, key, depth + 1)
            else:
                raise CheckpointError(f"{key} is an array of unknown value type {item_type}")
            return Field(vtype, start, self.pos, item_type=item_type, count=count)
        raise CheckpointError(f"{key} has unknown value type {vtype}")

    def tensor_info(
        self, block_sizes: dict[int, tuple[int, int]]
    ) -> tuple[str, tuple[int, ...], int, int, int]:
        name = self.name("a tensor name")
        label = shown(name)  # as messages show it
        n_dims = self.u32(f"the rank of {label}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise CheckpointError(
                f"tensor {label} has {n_dims} dimensions; ggml allows 1..{MAX_DIMS}"
            )
        dims = tuple(self.u64(f"the shape of {label}") for _ in range(n_dims))
        ggml_type = self.u32(f"the type of {label}")
        offset = self.u64(f"the offset of {label}")
        if ggml_type not in block_sizes:
            raise CheckpointError(f"tensor {label} has unknown ggml type {ggml_type}")
        block, block_bytes = block_sizes[ggml_type]
        if min(dims) < 1 or dims[0] % block:
            raise CheckpointError(
                f"tensor {label} has shape {list(dims)}; its type needs positive sizes and "
                f"rows a multiple of {block}"
            )
        n = 1
        for d in dims:
            n *= d
        nbytes = n // block * block_bytes
        if nbytes > self.size:
            raise CheckpointError(
                f"tensor {label} declares {nbytes} bytes, more than the file's {self.size}"
            )
        return name, dims, ggml_type, offset, nbytes


def _alignment(field: Field | None) -> int:
    """``general.alignment``: a power of two, 32 when absent."""
    if field is None:
        return DEFAULT_ALIGNMENT
    if field.vtype != UINT32:
        raise CheckpointError("general.alignment is not a uint32")
    if field.scalar == 0 or field.scalar & (field.scalar - 1):
        raise CheckpointError(f"general.alignment {field.scalar} is not a power of two")
    return int(field.scalar)


def _check_placement(tensors: tuple[TensorInfo, ...], size: int) -> None:
    """Every tensor's bytes inside the file, and no byte in two tensors."""
    previous: TensorInfo | None = None
    for t in sorted(tensors, key=lambda t: t.start):
        if t.start + t.nbytes > size:
            raise CheckpointError(
                f"tensor {shown(t.name)} declares bytes {t.start}..{t.start + t.nbytes}, past "
                f"the end of the file ({size} bytes): truncated or corrupt"
            )
        if previous is not None and t.start < previous.start + previous.nbytes:
            raise CheckpointError(
                f"tensor {shown(t.name)} (bytes {t.start}..{t.start + t.nbytes}) shares bytes "
                f"with {shown(previous.name)} (bytes {previous.start}.."
                f"{previous.start + previous.nbytes}): each tensor must have bytes of its own"
            )
        previous = t
