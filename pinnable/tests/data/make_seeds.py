"""Writes the small JPEG and PNG files the image fuzz runs start from (seeds/).

Run with Pillow installed: python3 make_seeds.py. The pictures are fixed (a seeded generator),
so running it again writes the same pixels; the files are committed.
"""

import io
import random

from PIL import Image

rng = random.Random(25)


def picture(w, h, mode="RGB"):
    im = Image.new("RGB", (w, h))
    im.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(w * h)])
    return im.convert(mode)


def exif(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def save(name, im, **kw):
    buf = io.BytesIO()
    im.save(buf, **kw)
    with open(f"seeds/{name}", "wb") as f:
        f.write(buf.getvalue())


save("baseline-420-exif.jpg", picture(13, 9), format="JPEG", quality=60, subsampling=2,
     exif=exif(6))
save("progressive-420.jpg", picture(11, 7), format="JPEG", quality=60, progressive=True)
save("baseline-444.jpg", picture(9, 5), format="JPEG", quality=60, subsampling=0)
save("gray.jpg", picture(8, 6, "L"), format="JPEG", quality=60)
save("cmyk.jpg", picture(6, 4, "CMYK"), format="JPEG", quality=60)
save("restart-422.jpg", picture(17, 9), format="JPEG", quality=60, subsampling=1,
     restart_marker_blocks=1)
save("rgb.png", picture(7, 5), format="PNG")
save("rgba-exif.png", picture(5, 4, "RGBA"), format="PNG", exif=exif(3))
save("palette.png", picture(6, 6, "P"), format="PNG")
save("gray16.png", picture(5, 3, "L").convert("I;16"), format="PNG")
save("interlaced.png", picture(9, 9), format="PNG", interlace=1)
save("gray-alpha.png", picture(4, 4, "LA"), format="PNG")
# Over 32 pixels a side: decoded by zune-jpeg, not the small-picture path.
save("baseline-420-large.jpg", picture(40, 34).resize((40, 34)), format="JPEG", quality=30,
     subsampling=2)
