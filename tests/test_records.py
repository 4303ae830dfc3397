"""A record as a store gives it back: ``as_stored``, asked on every append."""

from __future__ import annotations

from hearth.records import AssistantToolCall, ToolStepSettled, as_stored


def step(value: object, step: str = "s1") -> ToolStepSettled:
    return ToolStepSettled(id=f"m_1:step:c1:{step}", tool_call_id="c1", step=step, value=value)


def test_a_record_of_plain_text_and_numbers_is_given_back_itself() -> None:
    for record in (step(1), step(None), step(2.5), step(True), step("done")):
        assert as_stored(record) is record


def test_text_beyond_ascii_without_half_a_surrogate_pair_is_kept_as_it_is() -> None:
    record = step("café ☕", step="étape")
    assert as_stored(record) is record


def test_half_a_surrogate_pair_anywhere_is_replaced_as_a_store_replaces_it() -> None:
    assert as_stored(step("cut \ud83d")).value == "cut \ufffd"
    assert as_stored(step(1, step="s\udc00")).step == "s\ufffd"
    nested = as_stored(step({"items": ["ok", {"deep": "\ud83d"}]}))
    assert nested.value == {"items": ["ok", {"deep": "\ufffd"}]}
    call = AssistantToolCall(
        id="m_1:call:c1", message_id="m_1", tool_call_id="c1", name="t", arguments={"k": "\udfff"}
    )
    assert as_stored(call).arguments == {"k": "\ufffd"}
