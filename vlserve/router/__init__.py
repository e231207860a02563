"""Data parallelism: a cache-aware router that sees images, in front of vlserve servers.

keys.py computes the engine's own radix key for a request (text ids + each image's pseudo tokens),
tree.py keeps an approximate radix tree per worker, policy.py picks a worker (SGLang's cache-aware
policy), workers.py tracks load and health, proxy.py is the HTTP front, data_parallel.py starts N
servers and the router in one command (`vlserve serve --dp-size N`).
"""
