"""Headers texts and ids made column by column, for the sink's column-wise path: the same texts
`SentHeaderText.text` writes one by one, and ids `str(uuid.uuid4())` could be."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# text with what JSON escapes, "/" (escaped as "\/"), non-ASCII, white space
CLEAN = st.text(st.sampled_from(["a", "/", '"', "\\", "\n", "\x01", "ü", "😀", " ", "\u2028"]), max_size=6)


@settings(max_examples=1000, deadline=None)
@given(data=st.data(), n=st.integers(1, 6), one_intent=st.booleans(), one_type=st.booleans(),
       correlations=st.booleans(), reply_to=st.sampled_from(["none", "one", "each"]), time_sent=CLEAN, machine=CLEAN)
def test_sent_header_texts_are_the_texts_of_each(data: Any, n: int, one_intent: bool, one_type: bool, correlations: bool,
                                                 reply_to: str, time_sent: str, machine: str) -> None:
    """`SentHeaderText.texts` writes, column by column, what `text` writes for each message."""
    from spark_qtransport.wire import SentHeaderText

    each = lambda strategy: data.draw(st.lists(strategy, min_size=n, max_size=n))  # noqa: E731
    message_ids, conversations = each(CLEAN.filter(bool)), each(CLEAN)
    intents = data.draw(st.sampled_from(["Send", "Reply", "Publish"])) if one_intent else each(
        st.sampled_from(["Send", "Reply", "Publish"]))
    types = data.draw(CLEAN.filter(bool)) if one_type else each(CLEAN.filter(bool))
    correlation_ids = each(st.one_of(st.none(), st.just(""), CLEAN)) if correlations else None
    replies: Any = {"none": None, "one": data.draw(st.one_of(st.just(""), CLEAN)),
                    "each": each(st.one_of(st.none(), st.just(""), CLEAN))}[reply_to]
    writer = SentHeaderText(endpoint="Sales/East", machine=machine, content_type="application/json", new_id=lambda: "")
    got = writer.texts(message_ids=message_ids, intent=intents, enclosed=types, correlation_ids=correlation_ids,
                       reply_to=replies, time_sent=time_sent, conversations=conversations)

    def at(value: Any, i: int) -> Any:
        return value if value is None or isinstance(value, str) else value[i]

    want = []
    for i in range(n):
        writer._new_id = lambda i=i: conversations[i]  # type: ignore[misc]
        want.append(writer.text(message_id=message_ids[i], intent=at(intents, i), enclosed=at(types, i),
                                correlation_id=at(correlation_ids, i) or message_ids[i], reply_to=at(replies, i),
                                time_sent=time_sent, given=None))
    assert got == want


@pytest.mark.parametrize("n", [0, 1, 2, 257, 5000])
def test_uuid4_lists_are_distinct_version_4_uuid_texts(n: int) -> None:
    from spark_qtransport.wire import uuid4_list

    ids = uuid4_list(n)
    assert len(ids) == n and len(set(ids)) == n
    for text in ids:
        u = uuid.UUID(text)
        assert str(u) == text and u.version == 4 and u.variant == uuid.RFC_4122
