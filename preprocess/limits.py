"""Limits on what a request may send us. Every violation raises MediaError naming the limit."""

from dataclasses import dataclass

from .errors import MediaError


@dataclass(frozen=True)
class MediaLimits:
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000  # checked from the header, before any pixel is decoded
    max_images_per_request: int = 16
    video_max_bytes: int = 200 * 1024 * 1024
    video_max_duration_s: float = 600.0
    video_max_frames: int = 64  # frames sampled from one video (each costs vision-tower tokens)
    # pixels decoded to reach the last sampled frame (every frame before it is decoded): bounds one
    # video's decode to about half a minute on one loaded core (benchmarks/media_preprocess_cost.py);
    # 5 minutes of 720p or 10 of 480p at 30 fps fit, where 10 minutes of 4K at 240 fps took hours
    video_max_decoded_pixels: int = 10_000_000_000
    allow_url_fetch: bool = False
    url_timeout_s: float = 10.0  # whole fetch, not per read
    url_max_bytes: int = 50 * 1024 * 1024
    allowed_media_path: str | None = None  # local paths are refused unless this is set
    allowed_media_domains: tuple[str, ...] = ()  # URL hosts fetched even when they resolve to non-public addresses

    def __post_init__(self):
        for name in ("max_image_bytes", "max_image_pixels", "max_images_per_request", "video_max_bytes",
                     "video_max_frames", "video_max_decoded_pixels", "url_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"MediaLimits.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("video_max_duration_s", "url_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MediaLimits.{name} must be > 0, got {getattr(self, name)}")


def check_over(what: str, value: int | float, unit: str, limits: MediaLimits, limit_name: str, detail: str = ""):
    limit = getattr(limits, limit_name)
    if value > limit:
        suffix = f" ({detail})" if detail else ""
        raise MediaError(f"{what} has {value} {unit}, over the limit {limit_name}={limit}{suffix}")


def check_image_count(n_images: int, limits: MediaLimits) -> None:
    check_over("request", n_images, "images", limits, "max_images_per_request")
