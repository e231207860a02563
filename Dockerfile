# vlserve on a CUDA machine: the CUDA build of torch, the Triton kernels (picked automatically when a
# GPU is visible), the server on port 30000 as an unprivileged user.
#   docker build -t vlserve .
#   docker run --gpus all -p 30000:30000 -v /models:/models vlserve --model /models/llava-1.5-7b-hf
#   docker run --gpus all -p 30000:30000 -v ~/.cache/huggingface:/hf -e HF_HOME=/hf vlserve --model llava-hf/llava-1.5-7b-hf
# Without --model it serves the built-in model. Any `vlserve serve` flag can follow the image name.
# The image installs the wheel the first stage builds (tests/test_wheel_install.py builds the same
# wheel from the same files and serves from a fresh virtual environment).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS base

# Triton compiles its launcher on first use: it needs a C compiler and the Python headers.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN python3 -m venv "$VIRTUAL_ENV" && pip install --no-cache-dir "pip>=24"

# The wheel, built from the files the package is made of.
FROM base AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY vlserve ./vlserve
COPY kernels ./kernels
COPY preprocess ./preprocess
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM base
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "torch==2.13.0" && pip install --no-cache-dir /wheels/vlserve-*.whl && rm -rf /wheels

RUN useradd --create-home --uid 1000 vlserve
USER 1000:1000
EXPOSE 30000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=4)"]
ENTRYPOINT ["vlserve", "serve", "--host", "0.0.0.0", "--port", "30000"]
