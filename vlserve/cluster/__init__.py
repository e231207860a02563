"""Ray Serve: vlserve engines as replicas, routed by the same cache-aware policy as `vlserve router`.

`serve run vlserve.cluster:app model=DIR num_replicas=N` (`pip install vlserve[cluster]`). Ray is
imported only here and only when the application is built: the rest of vlserve never needs it.
"""

from vlserve.cluster.application import app

__all__ = ["app"]
