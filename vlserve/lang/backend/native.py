"""Backends that speak vlserve's native protocol: the /generate request body (as SGLang's), sent to
an in-process Engine or over HTTP. Gen, the fork commit, run_batch's prefix and select share it."""

from vlserve.lang.backend.base import BaseBackend
from vlserve.lang.select_logprobs import select_choice


class NativeBackend(BaseBackend):
    def call(self, payload: dict) -> dict | list[dict]:
        """One /generate request body → its answer (a list for a batch). Raises on an error."""
        raise NotImplementedError

    def call_stream(self, payload: dict):
        """Yields the cumulative chunks {"text", "meta_info"} of one streamed request."""
        raise NotImplementedError

    def media_value(self, item):
        """How an image or video travels in this transport."""
        raise NotImplementedError

    def prompt(self, text: str | list[str], media: list, batch: bool = False) -> dict:
        """The prompt part of a request body; in a batch every prompt carries the same media."""
        images = [self.media_value(m) for m in media if m.kind == "image"]
        videos = [m for m in media if m.kind == "video"]
        out = {"text": text}
        if images:
            out["image_data"] = [images] * len(text) if batch else images
        if videos:
            frames = {m.num_frames for m in videos}
            if len(frames) > 1:
                raise ValueError(f"the videos of one state must share num_frames (got {sorted(frames)}): "
                                 "a request samples one frame count for all its videos")
            values = [self.media_value(m) for m in videos]
            out["video_data"] = [values] * len(text) if batch else values
            out["video_num_frames"] = frames.pop()
        return out

    def cache_prefix(self, prefix_str: str, media: list = ()) -> None:
        self.call({**self.prompt(prefix_str, list(media)), "sampling_params": {"max_new_tokens": 0}})

    def commit_lazy_operations(self, s) -> dict:
        result = self.call({**self.prompt(s.text_, s.media), "sampling_params": {"max_new_tokens": 0}})
        s.token_mark = (len(s.text_), result["meta_info"]["prompt_tokens"])
        return result

    def generate(self, s, sampling_params) -> tuple[str, dict]:
        result = self.call({**self.prompt(s.text_, s.media), "sampling_params": sampling_params.to_runtime(),
                            **sampling_params.request_fields()})
        meta = result["meta_info"]
        s.token_mark = (len(s.text_) + len(result["text"]), meta["prompt_tokens"] + meta["completion_tokens"])
        return result["text"], meta

    def generate_stream(self, s, sampling_params):
        payload = {**self.prompt(s.text_, s.media), "sampling_params": sampling_params.to_runtime(),
                   **sampling_params.request_fields()}
        sent, start, meta = "", len(s.text_), {}
        for chunk in self.call_stream(payload):
            text, meta = chunk["text"], chunk["meta_info"]
            delta = text[len(sent):] if text.startswith(sent) else ""
            sent = text if text.startswith(sent) else sent
            yield delta, meta
        if meta:
            s.token_mark = (start + len(sent), meta["prompt_tokens"] + meta["completion_tokens"])

    def select(self, s, choices: list[str], temperature: float, choices_method):
        return select_choice(self.call, self.prompt, s, choices, choices_method)
