"""Reading short-lived containers' settings through the real engine while they exist."""

from __future__ import annotations

import threading
import time


class InspectOnCreate(threading.Thread):
    """Inspects each container matching every label filter the moment the engine reports it created.

    The operators and the plugin remove their helper containers when they exit (often within the
    same request), so their settings can only be read from the engine's "create" events as they
    arrive. ``created`` lists every id the engine created; ``inspected`` maps the ids it could still
    inspect to their ``docker inspect``; ``missed`` are the ones gone before it looked.
    """

    def __init__(self, client, *labels: str):
        super().__init__(daemon=True)
        self.client = client
        self.created: list[str] = []
        self.inspected: dict[str, dict] = {}
        self.stream = client.api.events(decode=True, filters={"type": "container", "event": "create",
                                                              "label": list(labels)})

    def run(self):
        import docker

        try:
            for event in self.stream:
                container_id = event["Actor"]["ID"]
                self.created.append(container_id)
                try:
                    self.inspected[container_id] = self.client.api.inspect_container(container_id)
                except docker.errors.NotFound:
                    pass
        except Exception:  # the stream was closed
            pass

    @property
    def missed(self) -> list[str]:
        return [c for c in self.created if c not in self.inspected]

    def stop(self) -> dict[str, dict]:
        time.sleep(1)  # events of the last containers reach the stream
        self.stream.close()
        self.join(timeout=10)
        return self.inspected
