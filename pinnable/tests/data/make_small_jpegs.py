"""Writes small subsampled JPEGs with Pillow and libjpeg-turbo's decode of each (small420/).

For every size in SIZES and each chroma subsampling, `<w>x<h>-<sub>.jpg` is the file and
`<w>x<h>-<sub>.rgb` its pixels as Pillow decodes them (libjpeg-turbo, fancy upsampling), raw
RGB rows. The pictures are seeded noise over a colour ramp, so the chroma varies sharply.
Run with Pillow installed: python3 make_small_jpegs.py.
"""

import io
import random

from PIL import Image

rng = random.Random(6)
SIZES = [(1, 1), (2, 2), (2, 3), (3, 2), (4, 4), (5, 3), (7, 5), (8, 8), (9, 7), (13, 17),
         (16, 2), (17, 17)]
for w, h in SIZES:
    for name, sub in (("420", 2), ("422", 1), ("444", 0)):
        im = Image.new("RGB", (w, h))
        im.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256))
                    for _ in range(w * h)])
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90, subsampling=sub)
        data = buf.getvalue()
        with open(f"small420/{w}x{h}-{name}.jpg", "wb") as f:
            f.write(data)
        with open(f"small420/{w}x{h}-{name}.rgb", "wb") as f:
            f.write(Image.open(io.BytesIO(data)).convert("RGB").tobytes())

# Pictures at most 4 pixels wide and taller than one MCU, whose chroma libjpeg repeats rather
# than interpolates: rows from several MCUs, and a progressive one.
rng = random.Random(25)
for w, h, name, sub, progressive in [(4, 37, "420", 2, False), (3, 40, "420", 2, False),
                                     (1, 33, "420", 2, False), (2, 18, "422", 1, False),
                                     (4, 35, "422", 1, False), (3, 21, "422", 1, True)]:
    im = Image.new("RGB", (w, h))
    im.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256))
                for _ in range(w * h)])
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90, subsampling=sub, progressive=progressive)
    data = buf.getvalue()
    stem = f"small420/{w}x{h}-{name}{'p' if progressive else ''}"
    with open(f"{stem}.jpg", "wb") as f:
        f.write(data)
    with open(f"{stem}.rgb", "wb") as f:
        f.write(Image.open(io.BytesIO(data)).convert("RGB").tobytes())
