"""Images in: decoding (Pillow), sources and limits, and libmtmd's resize.

The resize is checked here against a literal, loop-by-loop port of
mtmd-image.cpp's resize_pillow (precompute_weights, resample_horizontal,
resample_vertical) written for this test; tests/test_vision_llamacpp.py checks
the whole preprocessing against libmtmd itself, through the embeddings.
"""
from __future__ import annotations

import base64
import io
import math

import numpy as np
import pytest

PIL = pytest.importorskip("PIL.Image")

from elelem.vision import ImageError, ImageLimits, decode, load  # noqa: E402
from elelem.vision.preprocess import to_float  # noqa: E402
from elelem.vision.resize import resize, resize_padded  # noqa: E402


def _encoded(img, fmt="PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _rgb(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_png_decodes_to_its_pixels_and_alpha_is_dropped_not_composited():
    px = _rgb(7, 5)
    alpha = np.random.default_rng(1).integers(0, 256, (7, 5, 1), dtype=np.uint8)
    img = decode(_encoded(PIL.fromarray(np.concatenate([px, alpha], axis=2), "RGBA")))
    np.testing.assert_array_equal(img.pixels, px)   # stb_image with 3 channels: alpha dropped
    assert (img.width, img.height) == (5, 7)


def test_grey_and_palette_images_become_rgb():
    grey = np.random.default_rng(2).integers(0, 256, (4, 6), dtype=np.uint8)
    img = decode(_encoded(PIL.fromarray(grey, "L")))
    np.testing.assert_array_equal(img.pixels, np.repeat(grey[:, :, None], 3, axis=2))
    pal = PIL.fromarray(_rgb(4, 6)).quantize(8)
    img = decode(_encoded(pal))
    np.testing.assert_array_equal(img.pixels, np.asarray(pal.convert("RGB")))


def test_a_gif_gives_its_first_frame():
    frames = [PIL.fromarray(np.full((3, 3, 3), v, np.uint8)).convert("P") for v in (0, 255)]
    data = _encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    img = decode(data)
    assert img.pixels.shape == (3, 3, 3) and (img.pixels == 0).all()


def test_the_same_pixels_have_the_same_digest_whatever_the_encoding():
    px = _rgb(8, 8, 5)
    a = decode(_encoded(PIL.fromarray(px), "PNG"))
    b = decode(_encoded(PIL.fromarray(px), "WEBP", lossless=True))
    assert a.digest == b.digest
    assert decode(_encoded(PIL.fromarray(_rgb(8, 8, 6)))).digest != a.digest


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"not an image at all", "could not be decoded"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "could not be decoded"),
])
def test_bad_bytes_raise_a_clear_error(data, message):
    with pytest.raises(ImageError, match=message):
        decode(data)


def test_limits_on_bytes_and_pixels():
    data = _encoded(PIL.fromarray(_rgb(40, 50)))
    with pytest.raises(ImageError, match="bytes; the limit"):
        decode(data, ImageLimits(max_bytes=len(data) - 1))
    with pytest.raises(ImageError, match="2,000 pixels; the limit is 1,999"):
        decode(data, ImageLimits(max_pixels=1999))
    assert decode(data, ImageLimits(max_pixels=2000)).width == 50


def test_sources_data_urls_paths_and_urls(tmp_path):
    data = _encoded(PIL.fromarray(_rgb(3, 4)))
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert load(url).height == 3
    with pytest.raises(ImageError, match="base64"):
        load("data:image/png;base64,@@@")
    (tmp_path / "a.png").write_bytes(data)
    with pytest.raises(ImageError, match="local image paths are not allowed"):
        load(str(tmp_path / "a.png"))
    assert load(str(tmp_path / "a.png"), ImageLimits(allowed_dir=tmp_path)).width == 4
    assert load("a.png", ImageLimits(allowed_dir=tmp_path)).width == 4
    with pytest.raises(ImageError, match="outside the allowed image directory"):
        load(str(tmp_path / ".." / "a.png"), ImageLimits(allowed_dir=tmp_path / "sub"))
    with pytest.raises(ImageError, match="http\\(s\\) image URLs are not allowed"):
        load("https://example.com/a.png")
    with pytest.raises(ImageError, match="unsupported image URL scheme"):
        load("ftp://example.com/a.png")


# -- libmtmd's resize, ported loop by loop --------------------------------------------------------

def _mtmd_resize_literal(src: np.ndarray, tw: int, th: int, algo: str) -> np.ndarray:
    """mtmd-image.cpp's resize_pillow, as written there (scalar loops, int32 sums)."""
    support_of = {"bilinear": 1.0, "bicubic": 2.0}[algo]

    def filt(x):
        x = abs(x)
        if algo == "bilinear":
            return 1.0 - x if x < 1.0 else 0.0
        a = -0.5
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0

    def weights(in_size, out_size):
        scale = filterscale = in_size / out_size
        filterscale = max(filterscale, 1.0)
        support = support_of * filterscale
        ksize = int(math.ceil(support)) * 2 + 1
        bounds, kk = [], []
        for xx in range(out_size):
            center = (xx + 0.5) * scale
            ss = 1.0 / filterscale
            xmin = max(int(center - support + 0.5), 0)
            xmax = min(int(center + support + 0.5), in_size) - xmin
            w = [filt((x + xmin - center + 0.5) * ss) for x in range(xmax)]
            ww = 0.0
            for v in w:
                ww += v
            w = [v / ww if ww != 0.0 else v for v in w] + [0.0] * (ksize - xmax)
            kk.append([int(v * (1 << 22) + (-0.5 if v < 0 else 0.5)) for v in w])
            bounds.append((xmin, xmax))
        return bounds, kk

    def clip8(v):
        return min(max(v >> 22, 0), 255)

    h, w, _ = src.shape
    out = src.astype(np.int64)
    if tw != w:
        bounds, kk = weights(w, tw)
        tmp = np.zeros((h, tw, 3), np.int64)
        for y in range(h):
            for xx in range(tw):
                xmin, cnt = bounds[xx]
                for c in range(3):
                    s = 1 << 21
                    for x in range(cnt):
                        s += int(out[y, xmin + x, c]) * kk[xx][x]
                    tmp[y, xx, c] = clip8(s)
        out = tmp
    if th != h:
        bounds, kk = weights(h, th)
        tmp = np.zeros((th, out.shape[1], 3), np.int64)
        for yy in range(th):
            ymin, cnt = bounds[yy]
            for x in range(out.shape[1]):
                for c in range(3):
                    s = 1 << 21
                    for y in range(cnt):
                        s += int(out[ymin + y, x, c]) * kk[yy][y]
                    tmp[yy, x, c] = clip8(s)
        out = tmp
    return out.astype(np.uint8)


@pytest.mark.parametrize("algo", ["bilinear", "bicubic"])
@pytest.mark.parametrize("src, dst", [((7, 11), (16, 16)), ((33, 5), (8, 12)), ((16, 16), (16, 9)),
                                      ((40, 3), (13, 13)), ((9, 9), (9, 9))])
def test_resize_is_mtmds_arithmetic(algo, src, dst):
    px = _rgb(*src, seed=sum(src))
    np.testing.assert_array_equal(resize(px, dst[1], dst[0], algo), _mtmd_resize_literal(px, dst[1], dst[0], algo))


def test_padded_resize_centres_the_image_on_black():
    px = np.full((10, 20, 3), 200, np.uint8)
    out = resize_padded(px, 16, 16, "bilinear")
    assert out.shape == (16, 16, 3)
    assert (out[:4] == 0).all() and (out[12:] == 0).all() and (out[4:12] == 200).all()


def test_normalisation_is_float32_as_clip_image_f32_does_it():
    px = np.array([[[0, 128, 255]]], np.uint8)
    got = to_float(px, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    want = (np.float32([0, 128, 255]) / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    np.testing.assert_array_equal(got[:, 0, 0], want.astype(np.float32))
    assert got.dtype == np.float32 and got.shape == (3, 1, 1)


def test_damaged_images_raise_image_errors_only():
    """Bytes of real PNG, JPEG, GIF and WebP files with bytes overwritten or cut: each
    decodes or raises ImageError, nothing else (seeded, so a failure is reproducible)."""
    rng = np.random.default_rng(11)
    sources = [_encoded(PIL.fromarray(_rgb(24, 17, 9)), fmt) for fmt in ("PNG", "JPEG", "GIF", "WEBP")]
    for _ in range(300):
        data = bytearray(sources[rng.integers(len(sources))])
        for _ in range(rng.integers(1, 6)):
            data[rng.integers(len(data))] = rng.integers(256)
        if rng.random() < 0.3:
            data = data[:rng.integers(1, len(data))]
        try:
            img = decode(bytes(data))
        except ImageError:
            continue
        assert img.pixels.ndim == 3 and img.pixels.shape[2] == 3
