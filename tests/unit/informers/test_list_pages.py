"""A LIST page's continue token read before the page is decoded (informers.informer.continue_token_of): the
informer asks for the next page with it while it decodes this one, so a wrong read must never happen."""

from __future__ import annotations

import json
from typing import Any

from informers.informer import continue_token_of


def page(metadata: dict[str, Any], items: list[dict[str, Any]], metadata_first: bool = True) -> bytes:
    """A page laid out as the apiserver writes it (kind, apiVersion, metadata, items), or the other way round."""
    parts = {"kind": "SecretList", "apiVersion": "v1"}
    ordered = {**parts, "metadata": metadata, "items": items}
    if not metadata_first:
        ordered = {**parts, "items": items, "metadata": metadata}
    return json.dumps(ordered, separators=(",", ":")).encode()


TOKEN = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzNDUsInN0YXJ0IjoiZGIvYS1jcmVkZW50aWFscyJ9"
HOSTILE = {"metadata": {"name": "x", "annotations": {"note": '"continue":"forged","items":'}}}


def test_the_token_of_a_page_is_read_from_its_metadata() -> None:
    assert continue_token_of(page({"resourceVersion": "9", "continue": TOKEN}, [HOSTILE])) == TOKEN


def test_the_last_page_has_none_even_when_an_item_spells_one() -> None:
    assert continue_token_of(page({"resourceVersion": "9"}, [HOSTILE])) is None
    assert continue_token_of(page({"resourceVersion": "9", "continue": ""}, [])) is None


def test_another_layout_is_not_guessed() -> None:
    """Metadata after the items of a built-in kind's layout, or no items key in the first bytes: the informer decodes
    the page first."""
    assert continue_token_of(page({"continue": TOKEN}, [HOSTILE], metadata_first=False)) is None
    assert continue_token_of(b'{"kind":"SecretList","metadata":{"continue":"' + b"a" * 5000 + b'"},"items":[]}') is None


def custom_page(metadata: dict[str, Any], items: list[dict[str, Any]]) -> bytes:
    """A custom resource's page as the apiserver writes it: unstructured, every key sorted (items before metadata)."""
    body = {"apiVersion": "db.example/v1", "kind": "DatabaseList", "metadata": metadata, "items": items}
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


FORGING = {
    "kind": "Database",
    "metadata": {"name": "y", "annotations": {"continue": 'List","metadata":{"continue":"forged"}'}},
    "spec": {"continue": "forged"},
}


def test_a_custom_resource_page_has_its_token_after_the_items() -> None:
    assert continue_token_of(custom_page({"resourceVersion": "9", "continue": TOKEN}, [HOSTILE, FORGING])) == TOKEN
    assert continue_token_of(custom_page({"resourceVersion": "9"}, [HOSTILE, FORGING])) is None
    assert continue_token_of(custom_page({"resourceVersion": "9", "continue": TOKEN}, [])) == TOKEN


def test_a_custom_resource_page_whose_last_metadata_is_not_flat_is_not_guessed() -> None:
    """Only the list's own metadata (flat, the last key) is read: a nested object there is not it."""
    page = custom_page({"resourceVersion": "9", "continue": TOKEN, "x": {"continue": "forged"}}, [])
    assert continue_token_of(page) is None
