"""Image loading, limits, errors and processing parity with transformers (vlserve.preprocess)."""

import base64
import io
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from vlserve.preprocess import (
    ImageProcessing,
    MediaError,
    MediaLimits,
    check_image_count,
    load_image,
    prepare_image,
    process_image,
)


def encode(image: Image.Image, fmt: str = "PNG", **save_args) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **save_args)
    return buf.getvalue()


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_with_header(width: int, height: int, idat: bytes, color_type: int = 2) -> bytes:
    """A PNG whose IHDR says width x height, followed by the given (possibly far too short) IDAT payload."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat)
            + png_chunk(b"IEND", b""))


# --- formats -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["PNG", "BMP", "WEBP"])
def test_lossless_formats_round_trip_pixels(fmt):
    picture = noise(17, 11)
    save_args = {"lossless": True} if fmt == "WEBP" else {}
    loaded = load_image(encode(picture, fmt, **save_args))
    assert loaded.mode == "RGB" and loaded.size == (17, 11)
    assert np.array_equal(np.asarray(loaded), np.asarray(picture))


def test_jpeg_decodes_close_to_the_original():
    picture = Image.new("RGB", (32, 24), (200, 40, 90))
    loaded = load_image(encode(picture, "JPEG", quality=95))
    assert loaded.size == (32, 24)
    assert np.abs(np.asarray(loaded, dtype=int) - (200, 40, 90)).max() <= 6


def test_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (12, 8), colour) for colour in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    loaded = load_image(data)
    assert loaded.mode == "RGB" and loaded.size == (12, 8)
    assert tuple(np.asarray(loaded)[4, 6]) == (255, 0, 0)


def test_exif_orientation_is_applied():
    # 20x10, red left half / blue right half; orientation 6 = "rotate 90 degrees clockwise to display".
    picture = Image.new("RGB", (20, 10), (0, 0, 255))
    picture.paste((255, 0, 0), (0, 0, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = 6
    loaded = load_image(encode(picture, "PNG", exif=exif))
    assert loaded.size == (10, 20)
    pixels = np.asarray(loaded)
    assert tuple(pixels[2, 5]) == (255, 0, 0)  # the left half is now on top
    assert tuple(pixels[17, 5]) == (0, 0, 255)


def test_alpha_is_composited_on_white():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 255))
    rgba.putpixel((0, 0), (0, 0, 0, 0))  # fully transparent
    rgba.putpixel((1, 0), (0, 0, 0, 128))  # half transparent black
    pixels = np.asarray(load_image(encode(rgba)))
    assert tuple(pixels[0, 0]) == (255, 255, 255)
    assert tuple(pixels[0, 1]) == (127, 127, 127)
    assert tuple(pixels[1, 1]) == (10, 20, 30)


def test_palette_with_transparency_and_grayscale_become_rgb():
    gray = Image.new("L", (5, 5), 77)
    assert tuple(np.asarray(load_image(encode(gray)))[2, 2]) == (77, 77, 77)
    palette = Image.new("P", (5, 5), 1)
    palette.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    palette.info["transparency"] = 0
    palette.putpixel((0, 0), 0)
    pixels = np.asarray(load_image(encode(palette)))
    assert tuple(pixels[0, 0]) == (255, 255, 255) and tuple(pixels[3, 3]) == (200, 10, 10)


# --- sources ---------------------------------------------------------------------------------------

def test_data_uri_plain_base64_bytearray_and_memoryview_load_the_same_pixels():
    picture = noise(9, 7)
    data = encode(picture)
    b64 = base64.b64encode(data).decode()
    wrapped = "\n".join(b64[i:i + 60] for i in range(0, len(b64), 60))  # MIME-style line breaks
    for source in [data, bytearray(data), memoryview(data), f"data:image/png;base64,{b64}", b64, wrapped]:
        assert np.array_equal(np.asarray(load_image(source)), np.asarray(picture))


def test_local_paths_are_disabled_by_default(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(encode(noise(4, 4)))
    with pytest.raises(MediaError, match="local image paths are disabled"):
        load_image(str(path))
    with pytest.raises(MediaError, match="local image paths are disabled"):
        load_image(path)


def test_paths_load_only_under_the_allowed_directory(tmp_path):
    allowed, outside = tmp_path / "media", tmp_path / "secret"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "sub").mkdir()
    picture = noise(6, 5)
    (allowed / "sub" / "ok.png").write_bytes(encode(picture))
    (outside / "x.png").write_bytes(encode(picture))
    (allowed / "link.png").symlink_to(outside / "x.png")
    (allowed / "dirlink").symlink_to(outside)
    limits = MediaLimits(allowed_media_path=str(allowed))

    expected = np.asarray(picture)
    for source in [str(allowed / "sub" / "ok.png"), allowed / "sub" / "ok.png", "sub/ok.png",
                   f"file://{allowed}/sub/ok.png", str(allowed / "sub" / ".." / "sub" / "ok.png")]:
        assert np.array_equal(np.asarray(load_image(source, limits)), expected)

    for escape in [str(outside / "x.png"), "../secret/x.png", str(allowed / ".." / "secret" / "x.png"),
                   "link.png", "dirlink/x.png", f"file://{outside}/x.png"]:
        with pytest.raises(MediaError, match="outside allowed_media_path"):
            load_image(escape, limits)
    # A missing file outside the root is reported as outside, not as missing (no existence oracle).
    with pytest.raises(MediaError, match="outside allowed_media_path"):
        load_image(str(outside / "nope.png"), limits)
    with pytest.raises(MediaError, match="not found"):
        load_image("sub/missing.png", limits)


def test_unsupported_source_type():
    with pytest.raises(MediaError, match="unsupported image source of type int"):
        load_image(12345)


class _Handler(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def do_GET(self):
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(50):
                self.wfile.write(b"x" * 2000)
                self.wfile.flush()
                threading.Event().wait(0.05)
            return
        if self.path.startswith("/redirect-to/"):  # /redirect-to/<port>/<path> → http://127.0.0.1:<port>/<path>
            port, rest = self.path[len("/redirect-to/"):].split("/", 1)
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}/{rest}")
            self.end_headers()
            return
        if self.path == "/redirect-ftp":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/secret.png")  # urllib alone follows ftp
            self.end_headers()
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_url_fetch_is_disabled_by_default():
    with pytest.raises(MediaError, match=r"disabled \(allow_url_fetch=False\)"):
        load_image("https://example.com/cat.png")


LOCAL = ("127.0.0.1",)  # the test server is on loopback, which is refused unless allowed by name


def test_url_fetch_when_enabled(http_server):
    picture = noise(8, 8)
    _Handler.files = {"/a.png": encode(picture), "/big.png": encode(noise(64, 64))}
    limits = MediaLimits(allow_url_fetch=True, url_timeout_s=5, allowed_media_domains=LOCAL)
    assert np.array_equal(np.asarray(load_image(f"{http_server}/a.png", limits)), np.asarray(picture))
    with pytest.raises(MediaError, match="HTTP 404"):
        load_image(f"{http_server}/missing.png", limits)
    capped = MediaLimits(allow_url_fetch=True, url_max_bytes=1000, allowed_media_domains=LOCAL)
    with pytest.raises(MediaError, match=r"over the limit url_max_bytes=1000"):
        load_image(f"{http_server}/big.png", capped)
    small_images = MediaLimits(allow_url_fetch=True, max_image_bytes=1000, allowed_media_domains=LOCAL)
    with pytest.raises(MediaError, match=r"over the limit max_image_bytes=1000"):
        load_image(f"{http_server}/big.png", small_images)
    with pytest.raises(MediaError, match="redirect to a non-http"):
        load_image(f"{http_server}/redirect-ftp", limits)
    impatient = MediaLimits(allow_url_fetch=True, url_timeout_s=0.3, allowed_media_domains=LOCAL)
    with pytest.raises(MediaError, match=r"url_timeout_s=0.3"):
        load_image(f"{http_server}/slow", impatient)


# --- limits and errors ---------------------------------------------------------------------------------

def test_max_image_bytes_for_raw_base64_and_path(tmp_path):
    data = encode(noise(32, 32))
    limits = MediaLimits(max_image_bytes=len(data) - 1, allowed_media_path=str(tmp_path))
    pattern = rf"image has {len(data)} bytes, over the limit max_image_bytes={len(data) - 1}"
    with pytest.raises(MediaError, match=pattern):
        load_image(data, limits)
    with pytest.raises(MediaError, match=pattern):
        load_image("data:image/png;base64," + base64.b64encode(data).decode(), limits)
    (tmp_path / "big.png").write_bytes(data)
    with pytest.raises(MediaError, match=pattern):
        load_image("big.png", limits)
    assert load_image(data, MediaLimits(max_image_bytes=len(data))).size == (32, 32)


def test_max_image_pixels_names_limit_and_values():
    data = encode(Image.new("RGB", (100, 50)))
    with pytest.raises(MediaError, match=r"image has 5000 pixels, over the limit max_image_pixels=4999 "
                                         r"\(size 100x50\)"):
        load_image(data, MediaLimits(max_image_pixels=4999))
    assert load_image(data, MediaLimits(max_image_pixels=5000)).size == (100, 50)


def test_header_claiming_huge_size_is_rejected_before_decoding():
    # 50000x50000 RGB would need 7.5 GB; the body is a few bytes, so a decode would fail as truncated.
    bomb = png_with_header(50000, 50000, zlib.compress(b"\0" * 1000))
    with pytest.raises(MediaError, match=r"image has 2500000000 pixels, over the limit max_image_pixels=40000000"):
        load_image(bomb)
    # Between Pillow's warning threshold (~89M) and its error threshold (~179M): still our error.
    with pytest.raises(MediaError, match=r"image has 100000000 pixels, over the limit max_image_pixels=40000000"):
        load_image(png_with_header(10000, 10000, b""))
    # Our own check, below Pillow's thresholds.
    with pytest.raises(MediaError, match=r"image has 64000000 pixels, over the limit max_image_pixels=40000000"):
        load_image(png_with_header(8000, 8000, b""))


def test_pillow_bomb_warning_becomes_media_error_even_under_a_higher_limit():
    limits = MediaLimits(max_image_pixels=10**10)
    with pytest.raises(MediaError, match="decompression bomb"):
        load_image(png_with_header(10000, 10000, b""), limits)


def test_real_compressed_bomb_is_rejected_without_decoding(monkeypatch):
    # A valid 7000x7000 grayscale PNG of zeros: ~50 KB on disk, 49 MB decoded.
    width = height = 7000
    packer = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    bomb = png_with_header(width, height, idat, color_type=0)
    assert len(bomb) < 200_000
    loads = []
    original_load = Image.Image.load
    from PIL import ImageFile
    original_file_load = ImageFile.ImageFile.load
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(self) or original_load(self))
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self) or original_file_load(self))
    with pytest.raises(MediaError, match=r"image has 49000000 pixels, over the limit max_image_pixels=40000000"):
        load_image(bomb)
    assert loads == []  # no pixel buffer was ever asked for


def test_max_images_per_request():
    check_image_count(16, MediaLimits())
    with pytest.raises(MediaError, match=r"request has 3 images, over the limit max_images_per_request=2"):
        check_image_count(3, MediaLimits(max_images_per_request=2))


def test_not_an_image_truncated_and_invalid_base64_are_clear_errors():
    with pytest.raises(MediaError, match="not a supported image"):
        load_image(b"hello, this is not a picture")
    with pytest.raises(MediaError, match="not a supported image"):
        load_image(encode(Image.new("RGB", (4, 4)), "TIFF"))
    for fmt in ["PNG", "JPEG"]:
        data = encode(noise(64, 64), fmt)
        with pytest.raises(MediaError, match="truncated or corrupt"):
            load_image(data[: len(data) // 2])
    with pytest.raises(MediaError, match="is empty"):
        load_image(b"")
    with pytest.raises(MediaError, match="not valid base64"):
        load_image("data:image/png;base64,iVBORw0KGgo$$$")
    with pytest.raises(MediaError, match="not valid base64"):
        load_image("iVBORw0KGgoAA")  # base64 alphabet, but a length that is not a multiple of 4
    with pytest.raises(MediaError, match="must be base64-encoded"):
        load_image("data:image/png,rawbytes")


def test_limits_validate_themselves():
    with pytest.raises(ValueError, match="max_image_pixels"):
        MediaLimits(max_image_pixels=0)


# --- processing parity with transformers --------------------------------------------------------

HF_CONFIGS = [
    {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336},
     "crop_size": {"height": 336, "width": 336}, "resample": 3},
    {"image_processor_type": "LlavaImageProcessor", "do_pad": True, "size": {"shortest_edge": 48},
     "crop_size": {"height": 48, "width": 48}},
    {"image_processor_type": "CLIPImageProcessor", "size": {"height": 40, "width": 24}, "do_center_crop": False,
     "resample": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    {"image_processor_type": "CLIPImageProcessor", "size": 30, "crop_size": 40},  # crop larger: zero padding
    {"image_processor_type": "CLIPImageProcessor", "size": 30, "crop_size": 20, "do_normalize": False},
    {"image_processor_type": "CLIPImageProcessor", "do_resize": False, "crop_size": 20, "do_rescale": False},
    # SigLIP: resize to the exact size (aspect not kept), no crop, normalise 0.5/0.5 — as saved, and
    # with every key left to the class's defaults (224x224)
    {"image_processor_type": "SiglipImageProcessor", "size": {"height": 48, "width": 48}, "resample": 3,
     "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
     "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    {"image_processor_type": "SiglipImageProcessor", "size": {"height": 24, "width": 40}, "resample": 2},
    {"image_processor_type": "SiglipImageProcessor"},
]


def _hf_processor(config):
    # transformers 5.24 without torchvision: the PIL backends are the classes CLIPImageProcessor,
    # LlavaImageProcessor and SiglipImageProcessor fall back to (test_auto_image_processor_... checks).
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    kinds = {"Llava": LlavaImageProcessorPil, "Siglip": SiglipImageProcessorPil, "CLIP": CLIPImageProcessorPil}
    kind = next(k for prefix, k in kinds.items() if config["image_processor_type"].startswith(prefix))
    return kind(**{k: v for k, v in config.items() if k != "image_processor_type"})


@pytest.mark.parametrize("config", HF_CONFIGS, ids=lambda c: f"{c['image_processor_type']}-{c.get('size')}")
def test_processing_matches_transformers(config):
    hf = _hf_processor(config)
    ours = ImageProcessing.from_hf_config(config)
    for seed, (width, height) in enumerate([(50, 37), (37, 50), (64, 64), (13, 9)]):
        picture = noise(width, height, seed)
        expected = np.asarray(hf(picture, return_tensors="np")["pixel_values"][0], dtype=np.float32)
        got = ours(picture)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == expected.shape
        # Same operations in the same order and dtypes, so equal to the last bit (1e-6 leaves margin).
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("processor_type", ["SiglipImageProcessor", "CLIPImageProcessor"])
def test_auto_image_processor_loads_the_pil_class_we_match(tmp_path, processor_type):
    """What AutoImageProcessor (and so AutoProcessor) builds from a checkpoint's config here: without
    torchvision installed it is the PIL class (SiglipImageProcessorPil, CLIPImageProcessorPil) — the
    one our processing is compared with above — and ours gives its pixels."""
    import json

    from transformers import AutoImageProcessor

    config = next(c for c in HF_CONFIGS if c["image_processor_type"] == processor_type)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    hf = AutoImageProcessor.from_pretrained(str(tmp_path))
    assert type(hf).__name__ == processor_type + "Pil"
    picture = noise(70, 33, seed=5)
    expected = np.asarray(hf(picture, return_tensors="np")["pixel_values"][0], dtype=np.float32)
    np.testing.assert_allclose(ImageProcessing.from_hf_config(config)(picture), expected, rtol=0, atol=1e-6)


def test_siglip_defaults_are_its_class_defaults():
    siglip = ImageProcessing.from_hf_config({"image_processor_type": "SiglipImageProcessor"})
    assert siglip.resize_to == (224, 224) and not siglip.do_center_crop
    assert siglip.image_mean == (0.5, 0.5, 0.5) and siglip.image_std == (0.5, 0.5, 0.5)


def test_llava_pad_to_square_uses_the_mean_colour():
    config = {"image_processor_type": "LlavaImageProcessor", "do_pad": True, "size": {"shortest_edge": 8},
              "crop_size": {"height": 8, "width": 8}, "do_normalize": False, "resample": 0}
    wide = Image.new("RGB", (16, 8), (255, 255, 255))
    pixels = ImageProcessing.from_hf_config(config)(wide)
    mean_colour = [int(m * 255) / 255 for m in (0.48145466, 0.4578275, 0.40821073)]
    np.testing.assert_allclose(pixels[:, 0, 0], mean_colour, atol=1e-6)  # top rows are padding
    np.testing.assert_allclose(pixels[:, 4, 4], [1.0, 1.0, 1.0], atol=1e-6)
    # `do_pad` on a CLIP processor is batch padding, not pad-to-square.
    assert not ImageProcessing.from_hf_config({**config, "image_processor_type": "CLIPImageProcessor"}).do_pad_to_square


def test_from_hf_config_defaults_and_errors():
    default = ImageProcessing.from_hf_config({})
    assert default.shortest_edge == 224 and default.crop_size == (224, 224) and default.resample == 3
    with pytest.raises(ValueError, match="unsupported image processor size"):
        ImageProcessing.from_hf_config({"size": {"longest_edge": 100}})
    with pytest.raises(ValueError, match="image_mean needs 3 values"):
        ImageProcessing.from_hf_config({"image_mean": [0.5, 0.5]})


def test_prepare_image_output_and_thread_safety():
    processing = ImageProcessing.from_hf_config({"size": {"shortest_edge": 32}, "crop_size": 32})
    sources = [encode(noise(40 + i, 30, seed=i)) for i in range(6)]
    serial = [prepare_image(s, processing) for s in sources]
    with ThreadPoolExecutor(max_workers=3) as pool:
        parallel = list(pool.map(lambda s: prepare_image(s, processing), sources * 2))
    assert [p.content_hash for p in parallel] == [s.content_hash for s in serial] * 2
    first = serial[0]
    assert first.pixel_values.shape == (3, 32, 32) and first.pixel_values.dtype == np.float32
    assert len(first.content_hash) == 16
    assert process_image(load_image(sources[0]), processing).content_hash == first.content_hash


def test_url_fetch_cannot_reach_inside(http_server):
    """With fetching on, loopback (by IP or by a name resolving to it), private and link-local hosts are
    refused; a redirect from an allowed host to a refused one is refused too; errors echo nothing."""
    _Handler.files = {"/a.png": encode(noise(8, 8)), "/secret": b"TOP-SECRET internal answer"}
    port = http_server.rsplit(":", 1)[1]
    open_to_all = MediaLimits(allow_url_fetch=True, url_timeout_s=5)
    for url in (f"{http_server}/a.png", f"http://localhost:{port}/a.png", "http://169.254.169.254/latest/meta-data",
                "http://10.0.0.1/x.png", "http://[::1]:1/x.png", "http://0.0.0.0:1/x.png"):
        with pytest.raises(MediaError, match="non-public address"):
            load_image(url, open_to_all)
    via_name = MediaLimits(allow_url_fetch=True, url_timeout_s=5, allowed_media_domains=("localhost",))
    assert load_image(f"http://localhost:{port}/a.png", via_name).size == (8, 8)
    with pytest.raises(MediaError, match="non-public address"):  # the redirect goes to 127.0.0.1, not allowed
        load_image(f"http://localhost:{port}/redirect-to/{port}/a.png", via_name)
    allowed = MediaLimits(allow_url_fetch=True, url_timeout_s=5, allowed_media_domains=LOCAL)
    with pytest.raises(MediaError) as err:
        load_image(f"{http_server}/secret", allowed)
    assert "SECRET" not in str(err.value) and "internal" not in str(err.value)
