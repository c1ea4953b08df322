"""``torch.save`` of tensors that are never whole in memory.

:class:`StreamedSave` writes the file of ``torch.save(obj, path)`` where the
bytes of :obj:`obj`'s tensors arrive later, in pieces: it saves :obj:`obj`
once with :func:`torch.serialization.skip_data` (the pickle and the zip
layout with room for every storage, no data), then :meth:`StreamedSave.write`
puts each piece at its place with :func:`os.pwrite`, and
:meth:`StreamedSave.close` patches what ``skip_data`` left stale: the CRC-32
of every storage record (local header, data descriptor and central
directory) and the ``.data/serialization_id`` record that ``torch.save``
derives from the CRCs. The result is byte for byte the file ``torch.save``
writes for the same values (the tests check it), so ``torch.load`` and
``zipfile.ZipFile(path).testzip()`` accept it.

The placeholder tensors of :obj:`obj` are made with :func:`torch.empty`:
their pages are never touched, so they cost address space, not memory.
Each record must be written front to back (the CRC is computed on the way);
a piece out of order is an error, not a wrong checksum.
"""
import os
import struct
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

_LOCAL_HEADER = b'PK\x03\x04'
_CENTRAL_HEADER = b'PK\x01\x02'
_DESCRIPTOR = b'PK\x07\x08'
_END = b'PK\x05\x06'
_END64 = b'PK\x06\x06'
_MASK64 = (1 << 64) - 1


def _hash_combine(seed: int, value: int) -> int:
    # c10::hash_combine on 64-bit size_t, as PyTorchStreamWriter uses it for
    # the serialization id.
    mixed = (value + 0x9e3779b9 + ((seed << 6) & _MASK64) + (seed >> 2))
    return (seed ^ (mixed & _MASK64)) & _MASK64


def _storages_in_pickle_order(obj: Any) -> List[Tensor]:
    r"""The tensors of :obj:`obj` in the order ``torch.save`` numbers their
    storages (depth first, dictionaries in insertion order), one per
    storage."""
    found: List[Tensor] = []
    seen = set()

    def visit(value: Any) -> None:
        if isinstance(value, Tensor):
            key = value.untyped_storage()._cdata
            if key not in seen:
                seen.add(key)
                found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(obj)
    return found


def _central_directory(fd: int, size: int) -> Tuple[int, int]:
    r"""``(offset, count)`` of the zip's central directory (zip64 aware)."""
    tail_len = min(size, 65536 + 22)
    tail = os.pread(fd, tail_len, size - tail_len)
    at = tail.rfind(_END)
    if at < 0:
        raise ValueError('no zip end record')
    count, _, offset = struct.unpack('<HII', tail[at + 10:at + 20])
    if offset == 0xFFFFFFFF or count == 0xFFFF:
        at64 = tail.rfind(_END64)
        count, _, offset = struct.unpack('<QQQ', tail[at64 + 32:at64 + 56])
    return offset, count


class StreamedSave:
    r"""The file ``torch.save(obj, path)``, its tensors' bytes written
    piece by piece.

    Args:
        obj: What to save. Its tensors are placeholders (contiguous CPU
            tensors of the final shape and dtype, e.g. :func:`torch.empty`);
            their content is ignored.
        path (str): The file; its base name must be the final one (it names
            the archive inside the zip).
        save (callable, optional): What writes the skeleton, called as
            :obj:`save(obj, path)` inside :func:`~torch.serialization.skip_data`.
            (default: :func:`torch.save`)
    """

    def __init__(self, obj: Any, path: str,
                 save: Optional[Callable[[Any, str], None]] = None):
        self.path = path
        tensors = _storages_in_pickle_order(obj)
        for t in tensors:
            if not t.is_contiguous() or t.device.type != 'cpu' or \
                    t.storage_offset() != 0 or \
                    t.untyped_storage().nbytes() != t.nbytes:
                raise ValueError('StreamedSave placeholders must be whole, '
                                 'contiguous CPU tensors')
        with torch.serialization.skip_data():  # thread-local
            (save or torch.save)(obj, path)
        self.fd = os.open(path, os.O_RDWR)
        try:
            self._index(tensors)
        except BaseException:
            os.close(self.fd)
            raise

    def _index(self, tensors: List[Tensor]) -> None:
        size = os.fstat(self.fd).st_size
        offset, count = _central_directory(self.fd, size)
        table = os.pread(self.fd, size - offset, offset)
        # name -> [data offset, nbytes, central entry offset, local offset]
        records: Dict[str, List[int]] = {}
        self.order: List[str] = []
        at = 0
        for _ in range(count):
            if table[at:at + 4] != _CENTRAL_HEADER:
                raise ValueError('bad central directory')
            (size32, name_len, extra_len,
             comment_len) = struct.unpack('<IHHH', table[at + 24:at + 34])
            local = struct.unpack('<I', table[at + 42:at + 46])[0]
            name = table[at + 46:at + 46 + name_len].decode()
            extra = table[at + 46 + name_len:at + 46 + name_len + extra_len]
            nbytes = size32
            if size32 == 0xFFFFFFFF or local == 0xFFFFFFFF:
                nbytes, local = self._zip64(extra, size32, local)
            head = os.pread(self.fd, 30, local)
            lname, lextra = struct.unpack('<HH', head[26:30])
            records[name] = [local + 30 + lname + lextra, nbytes,
                             offset + at, local]
            self.order.append(name)
            at += 46 + name_len + extra_len + comment_len
        self.records = records
        prefix = self.order[0].rsplit('/', 1)[0]  # '<archive>/data.pkl'
        self.slots: List[str] = []
        for key, t in enumerate(tensors):
            name = f'{prefix}/data/{key}'
            if name not in records or records[name][1] != t.nbytes:
                raise ValueError(f"torch.save stored storage {key} unlike "
                                 f"expected ({t.nbytes} bytes)")
            self.slots.append(name)
        self.id_name = f'{prefix}/.data/serialization_id'
        self.written = [0] * len(tensors)
        self.crc = [0] * len(tensors)

    @staticmethod
    def _zip64(extra: bytes, size32: int, local: int) -> Tuple[int, int]:
        at = 0
        while at + 4 <= len(extra):
            field, length = struct.unpack('<HH', extra[at:at + 4])
            if field == 1:  # the ZIP64 extended information
                values = list(struct.unpack(f'<{length // 8}Q',
                                            extra[at + 4:at + 4 + length]))
                nbytes = values.pop(0) if size32 == 0xFFFFFFFF else size32
                if size32 == 0xFFFFFFFF:
                    values.pop(0)  # compressed size
                if local == 0xFFFFFFFF:
                    local = values.pop(0)
                return nbytes, local
            at += 4 + length
        raise ValueError('zip64 field missing')

    def write(self, index: int, data: Tensor) -> None:
        r"""Appends the bytes of :obj:`data` (any shape, the record's dtype)
        to the :obj:`index`-th tensor (in :obj:`obj`'s pickle order)."""
        data = data.contiguous()
        payload = data.view(-1).view(torch.uint8).numpy() \
            if data.numel() else b''
        name = self.slots[index]
        start, nbytes = self.records[name][:2]
        done = self.written[index]
        if done + len(payload) > nbytes:
            raise ValueError(f"'{self.path}': {done + len(payload)} bytes "
                             f"written to a record of {nbytes}")
        view = memoryview(payload)
        pos = 0
        while pos < len(view):
            pos += os.pwrite(self.fd, view[pos:pos + (1 << 30)],
                             start + done + pos)
        self.crc[index] = zlib.crc32(view, self.crc[index])
        self.written[index] = done + len(payload)

    def _patch_crc(self, name: str, crc: int) -> None:
        start, nbytes, central, local = self.records[name]
        packed = struct.pack('<I', crc)
        os.pwrite(self.fd, packed, central + 16)
        flags = struct.unpack('<H', os.pread(self.fd, 2, local + 6))[0]
        if flags & 0x8:  # the CRC is in a data descriptor after the data
            end = start + nbytes
            sig = os.pread(self.fd, 4, end)
            os.pwrite(self.fd, packed, end + 4 if sig == _DESCRIPTOR
                      else end)
        else:
            os.pwrite(self.fd, packed, local + 14)

    def _crc_of(self, name: str) -> int:
        start, nbytes = self.records[name][:2]
        return zlib.crc32(os.pread(self.fd, nbytes, start))

    def close(self) -> None:
        r"""Checks that every record is complete and patches the CRCs and
        the serialization id; the file is then final."""
        try:
            for name, done in zip(self.slots, self.written):
                if done != self.records[name][1]:
                    raise ValueError(
                        f"'{self.path}': record '{name}' got {done} of "
                        f"{self.records[name][1]} bytes")
            crcs = dict(zip(self.slots, self.crc))
            for name, crc in crcs.items():
                self._patch_crc(name, crc)
            combined = 0
            for name in self.order:
                if name == self.id_name or self.records[name][1] == 0:
                    continue  # torch.save skips empty records too
                crc = crcs[name] if name in crcs else self._crc_of(name)
                combined = _hash_combine(combined, crc)
            if self.id_name in self.records:
                start, nbytes = self.records[self.id_name][:2]
                old = os.pread(self.fd, nbytes, start)
                new = old[:20] + b'%020d' % combined
                if len(new) != nbytes:
                    raise ValueError(f"'{self.path}': unexpected "
                                     f"serialization id {old!r}")
                os.pwrite(self.fd, new, start)
                self._patch_crc(self.id_name, zlib.crc32(new))
        finally:
            os.close(self.fd)

    def __enter__(self) -> 'StreamedSave':
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            os.close(self.fd)


__all__ = ['StreamedSave']
