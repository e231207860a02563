"""Decode one image under the limits: JPEG, PNG, WebP, GIF (first frame), BMP; EXIF orientation applied; RGB out."""

import io
import re
import struct
import threading
import warnings
import zlib

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import MediaError
from .limits import MediaLimits, check_over
from .sources import MediaSource, read_source_bytes

IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")  # JPEG includes MPO, the multi-picture JPEG phones write
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, zlib.error)

# warnings.catch_warnings mutates process-global state; the lock keeps two of our threads from
# interleaving it. Only the header is parsed under the lock (Image.open is lazy), so it is brief.
_open_lock = threading.Lock()


def load_image(source: MediaSource | Image.Image, limits: MediaLimits = MediaLimits()) -> Image.Image:
    """An RGB PIL image from bytes, a data URI, base64, an allowed local path, (if enabled) a URL,
    or an already decoded PIL image (the offline engine's callers often have one)."""
    if isinstance(source, Image.Image):
        check_over("image", source.width * source.height, "pixels", limits, "max_image_pixels")
        return to_rgb(source)
    return decode_image(read_source_bytes(source, limits, "max_image_bytes", "image"), limits)


def decode_image(data: bytes, limits: MediaLimits = MediaLimits()) -> Image.Image:
    image = _open_header(data, limits)
    width, height = image.size
    check_over("image", width * height, "pixels", limits, "max_image_pixels", detail=f"size {width}x{height}")
    try:
        image.load()  # the first frame only, for GIF/WebP animations
        image = ImageOps.exif_transpose(image)
        return to_rgb(image)
    except _DECODE_ERRORS as e:
        raise MediaError(f"image data is truncated or corrupt ({image.format}, {width}x{height}): {e}") from None


def _open_header(data: bytes, limits: MediaLimits) -> Image.Image:
    try:
        with _open_lock, warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _bomb_error(str(e), limits) from None
    except UnidentifiedImageError:
        raise MediaError(f"bytes are not a supported image ({', '.join(IMAGE_FORMATS)})") from None
    except _DECODE_ERRORS as e:
        raise MediaError(f"image header is corrupt: {e}") from None


def _bomb_error(pillow_message: str, limits: MediaLimits) -> MediaError:
    """Pillow refuses huge headers before we see the size; name our limit when the image is over it too."""
    found = re.search(r"\((\d+) pixels\)", pillow_message)
    if found and int(found.group(1)) > limits.max_image_pixels:
        return MediaError(f"image has {found.group(1)} pixels, over the limit "
                          f"max_image_pixels={limits.max_image_pixels}")
    return MediaError(f"image rejected as a decompression bomb by Pillow: {pillow_message}")


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (as transformers' convert_to_rgb does)."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
