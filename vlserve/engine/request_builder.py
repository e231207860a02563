"""Building a Req from a caller's arguments: validation, media, tokenization, constraint compile.

Runs on the caller's thread (sync API) or the engine's media pool (async API), never on the
scheduling loop. Raises InvalidRequest / MediaError / ConstraintError naming the problem.
A regex / JSON schema is only handed to the compiler here (build_pending): the compile runs on the
compiler's worker processes and the caller waits for it (PendingReq), so a slow compile holds no
media-pool thread and no other request's preprocessing.
"""

import asyncio
import uuid
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from vlserve.constrained import ConstraintCompiler, ConstraintState
from vlserve.core.errors import InvalidRequest
from vlserve.core.request import Req
from vlserve.core.sampling_params import FLOAT32_MAX, SamplingParams
from vlserve.engine.prompt import PromptMedia, expand_image_tokens, expand_text, tokenize_text
from vlserve.engine.qwen_request import QwenMedia
from vlserve.model.config import ModelConfig
from vlserve.preprocess import MediaLimits, ProcessedImageCache, check_image_count


MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs


@dataclass
class PendingReq:
    """A built request whose constraint may still be compiling."""

    req: Req
    constraint: Future | None = None  # of the CompiledConstraint; None: no constraint

    def wait(self) -> Req:
        """The request with its constraint state (blocks while it compiles; raises ConstraintError)."""
        if self.constraint is not None:
            self.req.constraint = ConstraintState(self.constraint.result())
        return self.req

    async def ready(self) -> Req:
        """wait() for an asyncio caller: the event loop runs on meanwhile."""
        if self.constraint is not None:
            self.req.constraint = ConstraintState(await asyncio.wrap_future(self.constraint))
        return self.req


@dataclass
class RequestBuilder:
    tokenizer: object
    config: ModelConfig
    processing: object  # preprocess.ImageProcessing or AnyresProcessing (the model's)
    limits: MediaLimits
    video_frames: int  # default frames sampled per video
    context_len: int
    pool_capacity: int  # KV slots in the pool: no request may need more
    compiler: ConstraintCompiler
    image_cache: ProcessedImageCache  # the same upload (image or video) again skips decode, resize and hashing
    context_note: str = ""  # why context_len is below the model's positions (a sliding window), for 400s
    qwen: QwenMedia | None = None  # Qwen-VL: pads in the prompt, pictures and videos its own way

    def build(self, *args, **kwargs) -> Req:
        """build_pending, then wait for the constraint's compile."""
        return self.build_pending(*args, **kwargs).wait()

    def build_pending(self, prompt: str | None = None, input_ids: list[int] | None = None,
                      image_data: list | None = None, video_data: list | None = None,
                      sampling_params: dict | SamplingParams | None = None, return_logprob: bool = False,
                      logprob_start_len: int = -1, rid: str | None = None, video_num_frames: int | None = None,
                      video_fps: float | None = None, fit_max_new_tokens: bool = False,
                      top_logprobs_num: int = 0) -> PendingReq:
        """fit_max_new_tokens: lower max_new_tokens to what fits the context and the KV pool (a
        default the client did not ask for) instead of refusing the request."""
        params = (sampling_params if isinstance(sampling_params, SamplingParams)
                  else SamplingParams.from_dict(sampling_params))
        check_request_numbers(logprob_start_len, video_num_frames, video_fps)
        ids, spans = self._expanded(prompt, input_ids, image_data, video_data, video_num_frames, video_fps)
        if fit_max_new_tokens:
            params.max_new_tokens = min(params.max_new_tokens, self._room_to_generate(len(ids)))
        self._check_length(len(ids), params)
        if not (isinstance(top_logprobs_num, int) and 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS):
            raise InvalidRequest(f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                                 f"got {top_logprobs_num!r}", param="top_logprobs_num")
        req = Req(rid or uuid.uuid4().hex, ids, params, spans, return_logprob, logprob_start_len, top_logprobs_num)
        if self.config.mrope is not None:  # Qwen-VL: positions from the media grids, once (model/mrope.py)
            req.mrope = self.config.mrope.positions(len(ids), spans)
        if params.seed is not None:
            req.generator = torch.Generator().manual_seed(params.seed)
        if params.regex is None and params.json_schema is None:
            return PendingReq(req)
        return PendingReq(req, self.compiler.compile_async(params.regex, params.json_schema))

    def token_ids(self, prompt: str | None = None, input_ids: list[int] | None = None, image_data: list | None = None,
                  video_data: list | None = None, video_num_frames: int | None = None,
                  video_fps: float | None = None) -> list[int]:
        """The ids a request with these inputs would have: the radix key, pseudo tokens for media."""
        return self._expanded(prompt, input_ids, image_data, video_data, video_num_frames, video_fps)[0]

    def _expanded(self, prompt, input_ids, image_data, video_data, video_num_frames, video_fps):
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest("give exactly one of prompt (text) or input_ids")
        if self.qwen is not None:  # engine/qwen_request.py
            images = _as_list(image_data, "image_data")
            check_image_count(len(images), self.limits)
            return self.qwen.expanded(self.tokenizer, self.config, self.processing, self.image_cache, self.limits,
                                      prompt, input_ids, images, _as_list(video_data, "video_data"),
                                      video_num_frames or (None if video_fps else self.video_frames), video_fps)
        ids, ordered = self._tokens(prompt, input_ids, _as_list(image_data, "image_data"),
                                    _as_list(video_data, "video_data"), video_num_frames, video_fps)
        return expand_image_tokens(ids, self.config.image_token_id, ordered, self.config.image_tokens)

    def _tokens(self, prompt, input_ids, image_data, video_data, video_num_frames, video_fps):
        """Token ids (one image token per image or frame) and the processed images in their order."""
        check_image_count(len(image_data), self.limits)
        processing = self.processing.for_image_count(len(image_data))  # OneVision tiles a lone image only
        images = [self.image_cache.prepare_image(src, processing, self.limits) for src in image_data]
        frames_kw = ({"fps": video_fps} if video_fps is not None and video_num_frames is None
                     else {"num_frames": video_num_frames or (None if video_fps else self.video_frames),
                           "fps": video_fps})
        videos = [self.image_cache.prepare_video(src, self.processing, self.limits, **frames_kw) for src in video_data]
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InvalidRequest("prompt must be a string")
            text, ordered = expand_text(prompt, PromptMedia(images, videos))
            return tokenize_text(self.tokenizer, text), ordered
        vocab = self.config.text.vocab_size
        if not (isinstance(input_ids, list) and all(isinstance(t, int) and 0 <= t < vocab for t in input_ids)):
            raise InvalidRequest(f"input_ids must be a list of token ids in [0, {vocab})")
        return list(input_ids), images + [f for v in videos for f in v]

    def _room_to_generate(self, prompt_len: int) -> int:
        room = min(self.context_len, self.pool_capacity) - prompt_len
        if room < 1:
            raise InvalidRequest(f"the prompt has {prompt_len} tokens: no room to generate within the context "
                                 f"length of {self.context_len} tokens and the KV pool of {self.pool_capacity}"
                                 + (f" ({self.context_note})" if self.context_note else ""))
        return room

    def _check_length(self, prompt_len: int, params: SamplingParams) -> None:
        if prompt_len == 0:
            raise InvalidRequest("the prompt is empty")
        if prompt_len + params.max_new_tokens > self.context_len:
            raise InvalidRequest(f"the prompt has {prompt_len} tokens and max_new_tokens is {params.max_new_tokens}: "
                                 f"together over the context length of {self.context_len} tokens"
                                 + (f" ({self.context_note})" if self.context_note else ""))
        if prompt_len + params.max_new_tokens > self.pool_capacity:
            raise InvalidRequest(f"the request needs up to {prompt_len + params.max_new_tokens} KV slots, "
                                 f"over the KV pool of {self.pool_capacity}")


def check_request_numbers(logprob_start_len, video_num_frames, video_fps) -> None:
    """The request's numbers outside SamplingParams, whether or not it has a video."""
    if not (_is_int(logprob_start_len) and -1 <= logprob_start_len < 2**31):
        raise InvalidRequest(f"logprob_start_len must be -1 (off) or an integer in [0, 2**31), "
                             f"got {logprob_start_len!r}", param="logprob_start_len")
    if video_num_frames is not None and not (_is_int(video_num_frames) and 1 <= video_num_frames < 2**31):
        raise InvalidRequest(f"video_num_frames must be an integer >= 1, got {video_num_frames!r}",
                             param="video_num_frames")
    if video_fps is not None and not (isinstance(video_fps, (int, float)) and not isinstance(video_fps, bool)
                                      and 0 < video_fps <= FLOAT32_MAX):
        raise InvalidRequest(f"video_fps must be a finite number > 0, got {video_fps!r}", param="video_fps")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _as_list(value, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return [value]
    if isinstance(value, list):
        return value
    raise InvalidRequest(f"{name} must be a string, bytes or a list of them")
