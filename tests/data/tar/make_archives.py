"""Writes the awkward WebDataset shards the tar tests read, and the grouping webdataset 1.0
gives them (`<name>.expected`), so the Rust grouping is compared with the reference.

Run from this folder: `python3 make_archives.py` (needs `pip install webdataset`).

Expected-file format, one line each: `sample <key>` (bytes of the key that are not UTF-8 as
`\\xNN`), then `field <ext> <data>` for each of its fields (the data is ASCII without
newlines); or one line `error <message>` where webdataset raises, after the samples it yielded
first. Where Python's `tarfile` stops silently at a damaged header (`damaged_*`), webdataset
yields the samples before it and raises nothing.
"""

import io
import tarfile

import webdataset.tariterators as wti


def add(tar, name, data=None, kind=tarfile.REGTYPE, **kw):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mtime = 1_700_000_000
    if kind == tarfile.SYMTYPE:
        info.linkname = "elsewhere"
    payload = (data if data is not None else "data of " + name).encode("utf-8", "surrogateescape")
    if kind in (tarfile.REGTYPE, tarfile.AREGTYPE):
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    else:
        tar.addfile(info)


LONG = "long/" + "d" * 120 + "/" + "n" * 110


def awkward_gnu(tar):
    add(tar, "__meta__")
    add(tar, "000/abc.JPG")
    add(tar, "000/abc.Cls", "7")
    add(tar, "000/abc.seg.PNG")
    add(tar, "dir.with.dots/k1.txt")
    add(tar, "dir.with.dots/k1.json")
    add(tar, "README")
    add(tar, "somedir/", kind=tarfile.DIRTYPE)
    add(tar, LONG + ".Txt")
    add(tar, LONG + ".cls", "3")
    add(tar, "__index__/x.json")
    add(tar, "k2.txt")
    add(tar, "k3.txt")
    add(tar, "k2.cls", "2")
    add(tar, "dir/.hidden")
    add(tar, "k4.lnk", kind=tarfile.SYMTYPE)
    add(tar, "x.y.z.TAR.GZ")
    add(tar, "__a__b", "not meta")


def pax(tar):
    add(tar, LONG + ".jpg")
    add(tar, LONG + ".cls", "11")
    add(tar, "caf\u00e9/\u00fcber.txt")
    add(tar, "short.txt")
    add(tar, "short.json", '{"a": 1}')


def ustar(tar):
    prefix = "p" * 90 + "/" + "q" * 50
    add(tar, prefix + "/s1.txt")
    add(tar, prefix + "/s1.cls", "9")
    add(tar, "plain.txt")


def duplicate(tar):
    add(tar, "a.txt")
    add(tar, "b.jpg")
    add(tar, "b.JPG")
    add(tar, "c.txt")


def nonutf8(tar):
    # Names that differ only in bytes that are not UTF-8 (tarfile writes them back through
    # surrogateescape; GNU headers hold the bytes, pax headers mark them hdrcharset=BINARY).
    add(tar, "k\udcff.txt", "1")
    add(tar, "k\udcff.cls", "1")
    add(tar, "k\udcfe.txt", "2")
    add(tar, "k\udcfe.cls", "2")
    add(tar, "caf\u00e9\udce9.TXT", "3")
    add(tar, LONG + "\udc80.txt", "4")
    add(tar, LONG + "\udc81.txt", "5")


def samples(tar):
    for key in ["a", "b", "c", "d"]:
        add(tar, key + ".txt")
        add(tar, key + ".cls", str(ord(key)))


def corrupt(at):
    """Flips a name byte of the header at `at`: its checksum no longer matches."""
    def damage(raw):
        raw[at + 3] ^= 0x55
        return raw
    return damage


ARCHIVES = {
    "awkward_gnu": (awkward_gnu, dict(format=tarfile.GNU_FORMAT)),
    "pax": (pax, dict(format=tarfile.PAX_FORMAT, pax_headers={"comment": "global record"})),
    "ustar": (ustar, dict(format=tarfile.USTAR_FORMAT)),
    "duplicate": (duplicate, dict(format=tarfile.GNU_FORMAT)),
    "nonutf8": (nonutf8, dict(format=tarfile.GNU_FORMAT)),
    "nonutf8_pax": (nonutf8, dict(format=tarfile.PAX_FORMAT)),
}

# Shards of `samples` (members of 512 + 512 bytes) damaged where tarfile stops: a bad header
# after a whole sample (c.txt), a bad header inside a sample (b.cls), a header cut short.
DAMAGED = {
    "damaged_header": corrupt(4 * 1024),
    "damaged_member": corrupt(3 * 1024),
    "damaged_cut": lambda raw: raw[: 4 * 1024 + 100],
}


def reference(path):
    lines = []
    try:
        for sample in wti.tarfile_samples([dict(url=path)]):
            key = sample["__key__"].encode("utf-8", "surrogateescape")
            lines.append(f"sample {key.decode('utf-8', 'backslashreplace')}")
            for ext, value in sample.items():
                if ext.startswith("__"):
                    continue
                lines.append(f"field {ext} {value.decode()}")
    except ValueError as e:
        lines.append(f"error {e}")
    return "\n".join(lines) + "\n"


for name, (fill, opts) in ARCHIVES.items():
    with tarfile.open(f"{name}.tar", "w", **opts) as tar:
        fill(tar)
for name, damage in DAMAGED.items():
    whole = io.BytesIO()
    with tarfile.open(fileobj=whole, mode="w", format=tarfile.GNU_FORMAT) as tar:
        samples(tar)
    with open(f"{name}.tar", "wb") as f:
        f.write(damage(bytearray(whole.getvalue())))
for name in [*ARCHIVES, *DAMAGED]:
    with open(f"{name}.expected", "w") as f:
        f.write(reference(f"{name}.tar"))
