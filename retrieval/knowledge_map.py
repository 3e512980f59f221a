"""The knowledge map (every domain, what it covers, when to retrieve from it) from catalog entries.

Apart from the engine so that a process holding only a catalog (the console's page process)
builds the same map without importing the vector store.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from retrieval.models import DomainInfo, KnowledgeMap
from storage.catalog_records import CatalogEntry


def knowledge_map_of(entries: Iterable[CatalogEntry]) -> KnowledgeMap:
    """Every domain of ``entries`` with what it covers and when to retrieve from it."""
    by_domain: dict[str, list[CatalogEntry]] = defaultdict(list)
    for entry in entries:
        by_domain[entry.domain].append(entry)
    domains = [_domain_info(name, group) for name, group in sorted(by_domain.items())]
    return KnowledgeMap(domains=domains, document_count=sum(len(g) for g in by_domain.values()))


def _domain_info(name: str, entries: Sequence[CatalogEntry]) -> DomainInfo:
    titles = [e.title for e in entries]
    keywords = [k for e in entries for k in e.keywords]
    covers = list(dict.fromkeys([*titles, *keywords]))
    description = next((e.domain_description for e in entries if e.domain_description), "")
    if not description:
        # No front matter says what the domain is: aggregate from the titles.
        description = f"{len(entries)} documents about: " + "; ".join(titles[:8])
    when = next((e.when_to_retrieve for e in entries if e.when_to_retrieve), "")
    if not when:
        when = f"When the question concerns {name}: " + ", ".join(titles[:5])
    return DomainInfo(
        domain_id=name,
        description=description,
        covers=covers[:40],
        document_count=len(entries),
        when_to_retrieve=when,
    )
