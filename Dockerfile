# vlserve on a CUDA machine: the CUDA build of torch, the Triton kernels (picked automatically when a
# GPU is visible), the server on port 30000 as an unprivileged user.
#   docker build -t vlserve .
#   docker run --gpus all -p 30000:30000 -v /models:/models vlserve --model /models/llava-1.5-7b-hf
# Without --model it serves the built-in model. Any `vlserve serve` flag can follow the image name.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# Triton compiles its launcher on first use: it needs a C compiler and the Python headers.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN python3 -m venv "$VIRTUAL_ENV" && pip install --no-cache-dir "pip>=24"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY vlserve ./vlserve
COPY kernels ./kernels
COPY preprocess ./preprocess
RUN pip install --no-cache-dir "torch==2.13.0" && pip install --no-cache-dir .

RUN useradd --create-home --uid 1000 vlserve
USER 1000:1000
EXPOSE 30000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=4)"]
ENTRYPOINT ["vlserve", "serve", "--host", "0.0.0.0", "--port", "30000"]
