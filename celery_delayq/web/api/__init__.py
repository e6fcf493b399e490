"""The JSON API (``/api/...``), documented at ``/api/openapi.json``: one router per resource (:mod:`.overview`,
:mod:`.waiting`, :mod:`.parked`, :mod:`.live`).

A route only asks: FastAPI validates every parameter against its declared type (JSON booleans are strict), the
route takes the service and the caller from :mod:`..deps`, calls one method (which reads each value through
:mod:`celery_delayq.inputs`, as the page and the CLI do) and returns its model (:mod:`..schemas`); the
statuses besides 200 come from the package's own exceptions (:mod:`..errors`).
"""
