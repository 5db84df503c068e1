"""The students' Lab: the server side of the hidden-points lines under Validate's "Success!".

A Jupyter server extension (turned on by ``jupyter/student-lab``'s configuration) answers ``GET
course/hidden-points?path=NOTEBOOK`` with the lines of :func:`devcourse.validation.message`, which
the Lab plugin ``course-validate-hint`` adds to nbgrader's success dialog. It runs nothing of the
notebook, shows no hidden check, and needs no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path


def hidden_points_handler() -> type:
    """The request handler, made when the server loads the extension.

    Jupyter's server modules are imported here, not when ``devcourse.labhints``
    is: they bring in jsonschema, whose optional IRI checker compiles its
    grammar at import, and the grader's kernels import every
    ``devcourse`` module.
    """
    import nbformat
    from jupyter_server.base.handlers import JupyterHandler
    from tornado import web

    from devcourse.validation import message

    class HiddenPointsHandler(JupyterHandler):
        @web.authenticated
        def get(self) -> None:
            root = Path(self.settings["server_root_dir"]).expanduser().resolve()
            target = (root / self.get_argument("path")).resolve()
            if not target.is_relative_to(root) or target.suffix != ".ipynb":
                raise web.HTTPError(403, "only notebooks below the Lab's root folder")
            if not target.is_file():
                raise web.HTTPError(404, f"no notebook at {self.get_argument('path')}")
            try:
                nb = nbformat.read(target, as_version=4)
            except (OSError, ValueError) as error:
                raise web.HTTPError(400, f"not a readable notebook: {error}") from error
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"lines": message(nb)}))

    return HiddenPointsHandler


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "devcourse.labhints"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], "course", "hidden-points")
    web_app.add_handlers(".*$", [(route, hidden_points_handler())])
