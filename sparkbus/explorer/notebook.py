"""The dashboard as one piece of HTML for a notebook's output (Jupyter, Databricks): the entity table with
its counts and a link to the running Explorer, styled inline (a notebook does not load the Explorer's
stylesheet), every value escaped by the template."""
from __future__ import annotations

from typing import Optional

from ..management import ServiceBusAdministrationClient
from .app import templates
from .pages import dashboard


def dashboard_html(namespace: str, url: Optional[str] = None) -> str:
    """The namespace's dashboard now, as HTML; url: the Explorer to link to."""
    board = dashboard(ServiceBusAdministrationClient(namespace))
    return templates().get_template("notebook.html").render(board=board, namespace=namespace, url=url)
