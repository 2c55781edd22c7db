"""A paged list asks for its next page while it decodes this one: the continue token is read from the
undecoded page. Read here from a real apiserver's pages of both layouts: a built-in type's (metadata
before the items) and a custom resource's (sorted keys: the list's metadata after the items, as the
Databases of a fleet are listed). Every page's token is the one the decoded page holds; the last page
has none, even when an item spells a forged one."""

from __future__ import annotations

import json

import pytest

from informers import CONFIGMAPS, Informer, Resource, Rest
from informers.informer import continue_token_of
from tests.runtime.support import GROUP, WIDGETS, configmap, widget

# An annotation that spells the list metadata of the other layout: inside a JSON string its quotes are escaped.
FORGED = 'List","metadata":{"continue":"forged"},"items":["continue":"forged"'


def _pages(rest: Rest, resource: Resource, namespace: str, limit: int) -> list[bytes]:
    """Every page of a LIST of `limit` objects, as the apiserver sent it."""
    pages: list[bytes] = []
    token = ""
    while True:
        query = [("limit", str(limit))] + ([("continue", token)] if token else [])
        data = rest.get_bytes(resource.collection_path(namespace), query=query)
        pages.append(data)
        token = json.loads(data)["metadata"].get("continue") or ""
        if not token:
            return pages


def _check(pages: list[bytes]) -> None:
    assert len(pages) > 2
    for data in pages:
        assert continue_token_of(data) == (json.loads(data)["metadata"].get("continue") or None)
    assert continue_token_of(pages[-1]) is None


@pytest.mark.usefixtures("widgets_crd")
def test_a_custom_resource_page_has_its_token_at_the_end(admin_rest: Rest, namespace: str) -> None:
    for n in range(7):
        forged = widget(f"w-{n}", namespace, {"continue": "forged", "items": [{"metadata": {"continue": "forged"}}]})
        forged["metadata"]["annotations"] = {"continue": FORGED}
        admin_rest.create(WIDGETS, forged)
    pages = _pages(admin_rest, WIDGETS, namespace, 3)
    assert pages[0].startswith(f'{{"apiVersion":"{GROUP}/v1","items":['.encode())  # the sorted layout
    _check(pages)


def test_a_built_in_page_has_its_token_before_the_items(admin_rest: Rest, namespace: str) -> None:
    for n in range(7):
        admin_rest.create(CONFIGMAPS, configmap(f"cm-{n}", namespace, {"continue": FORGED}))
    pages = _pages(admin_rest, CONFIGMAPS, namespace, 3)
    assert b'"metadata":{' in pages[0][: pages[0].index(b'"items":')]
    _check(pages)


@pytest.mark.usefixtures("widgets_crd")
def test_a_paged_informer_fills_from_custom_resource_pages_with_forged_tokens(admin_rest: Rest, namespace: str) -> None:
    names = {f"w-{n}" for n in range(8)}
    for name in names:
        forged = widget(name, namespace)
        forged["metadata"]["annotations"] = {"continue": FORGED}
        admin_rest.create(WIDGETS, forged)
    informer = Informer(admin_rest, WIDGETS, namespace, stream_lists=False, page_size=3).start()
    try:
        assert informer.wait_for_sync(20), informer.sync_problem()
        assert {obj["metadata"]["name"] for obj in informer.list()} == names
    finally:
        informer.stop()
