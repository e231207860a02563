# vlserve on a CUDA machine: builds the package with the CUDA build of torch and runs the server.
#   docker build -t vlserve .
#   docker run --gpus all -p 30000:30000 -v /models:/models vlserve --model /models/llava-1.5-7b-hf
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN python3 -m venv $VIRTUAL_ENV && pip install --no-cache-dir --upgrade pip
WORKDIR /app
COPY pyproject.toml README.md ./
COPY vlserve ./vlserve
COPY kernels ./kernels
COPY preprocess ./preprocess
RUN pip install --no-cache-dir "torch==2.13.0" && pip install --no-cache-dir .
EXPOSE 30000
ENTRYPOINT ["vlserve", "serve", "--host", "0.0.0.0", "--port", "30000", "--attention-backend", "triton"]
