"""SIGTERM / SIGINT: a graceful stop. The first signal stops admissions (new requests get 503 and
/health says so), lets running requests finish for up to --shutdown-timeout seconds, ends what is
left with an error event, then lets uvicorn close; the process exits 0. A second signal exits at once.
"""

import logging
import threading
import time

import uvicorn

log = logging.getLogger(__name__)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, shutdown_timeout: float):
        super().__init__(config)
        self.engine, self.shutdown_timeout = engine, shutdown_timeout
        self._draining = False

    def handle_exit(self, sig, frame) -> None:
        if self._draining:  # the second signal: now
            log.warning("second signal: exiting now")
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        log.info("signal %s: draining (up to %g s), no new requests", sig, self.shutdown_timeout)
        threading.Thread(target=self._drain, name="vlserve-drain", daemon=True).start()

    def _drain(self) -> None:
        if not self.engine.drain(self.shutdown_timeout):
            log.warning("requests still running after %g s were ended with an error", self.shutdown_timeout)
        time.sleep(0.2)  # the last events reach their streams before uvicorn closes connections
        self.should_exit = True
