"""The JSON API (``/api/...``), documented at ``/api/openapi.json``: one router per resource.

* :mod:`.overview`: the ladder's counts and the doctor's findings;
* :mod:`.waiting`: waiting tasks, and cancelling, running now or moving them;
* :mod:`.parked`: parked messages, and replaying or deleting them.

A route only asks: FastAPI validates every parameter against the types declared
(JSON booleans are strict: ``"false"`` is not ``false``), the route takes the
:class:`~celery_delayq.web.service.Service` and the caller from :mod:`..deps`, calls one
method (which reads each value through :mod:`celery_delayq.inputs`, as the page and the
CLI do) and returns its model (:mod:`..schemas`). The statuses besides 200 come from the
package's own exceptions (:mod:`..errors`).
"""
