"""Model backends: the offline plan player and the streamed OpenAI-compatible client."""

from __future__ import annotations

import json

import pytest
import trio

from plugins.projects.engine.model_backends import (
    ConversationMessage,
    ModelBackendError,
    OfflineBackend,
    OpenAIChatBackend,
    ToolCallRequest,
)
from plugins.projects.engine.templates import builtin_templates
from plugins.projects.engine.tools import builtin_tools
from tests.support.fake_openai import FakeOpenAI, HttpFailure, RawReply, Reply, Stall, StreamedTurn
from tests.support.server import free_port

API_KEY = "sk-test-0123456789abcdef"
CONVERSATION = [ConversationMessage("system", "You build things."),
                ConversationMessage("user", "Build a pizza site.")]


async def start_fake(nursery: trio.Nursery, *script: Reply) -> tuple[FakeOpenAI, str]:
    fake = FakeOpenAI(list(script))
    base_url: str = await nursery.start(fake.serve)
    return fake, base_url


async def test_offline_backend_plays_the_plan_then_finishes() -> None:
    template = next(t for t in builtin_templates() if t.name == "research-agent")
    backend = OfflineBackend(template, "Study tides. Compare moons.", {"title": "Tides"})
    steps = template.offline_plan("Study tides. Compare moons.", {"title": "Tides"})

    assert backend.planned_steps() == [step.title for step in steps]
    for step in steps:
        turn = await backend.next_turn(CONVERSATION, builtin_tools())
        assert turn.text == step.say
        assert [(call.name, json.loads(call.arguments)) for call in turn.calls] == [
            (call.tool, call.args) for call in step.calls]
    final = await backend.next_turn(CONVERSATION, [])
    assert final.finished and final.text == ""


async def test_offline_backend_leaves_out_the_calls_of_tools_not_offered() -> None:
    template = next(t for t in builtin_templates() if t.name == "fullstack-builder")
    backend = OfflineBackend(template, "A moon site. It shows the moon.", {})
    steps = template.offline_plan("A moon site. It shows the moon.", {})
    played = [[call.name for call in (await backend.next_turn(CONVERSATION, builtin_tools())
                                      ).calls] for _ in steps]
    # Where no sandbox runs, the build's check and its screenshot are left out, not failed.
    assert [call.tool for call in steps[-1].calls] == ["run_command", "take_screenshot",
                                                      "git_commit"]
    assert played[-1] == ["git_commit"]


async def test_streamed_text_and_tool_calls_are_assembled(nursery: trio.Nursery) -> None:
    arguments = json.dumps({"path": "index.html", "content": "<h1>Pizza</h1>"})
    fake, base_url = await start_fake(nursery, StreamedTurn(
        "1. Write the page\n2. Commit it", [("write_file", arguments),
                                            ("git_commit", '{"message": "Add page"}')]))
    backend = OpenAIChatBackend(base_url, "fake-model", API_KEY, timeout=5)

    turn = await backend.next_turn(CONVERSATION, builtin_tools())

    assert turn.text == "1. Write the page\n2. Commit it"
    assert turn.calls == [ToolCallRequest("fake-0", "write_file", arguments),
                          ToolCallRequest("fake-1", "git_commit", '{"message": "Add page"}')]
    assert not turn.finished
    request = fake.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.body["model"] == "fake-model" and request.body["stream"] is True
    assert request.body["messages"] == [{"role": "system", "content": "You build things."},
                                        {"role": "user", "content": "Build a pizza site."}]
    offered = {tool["function"]["name"]: tool for tool in request.body["tools"]}
    assert offered["write_file"]["type"] == "function"
    assert offered["write_file"]["function"]["parameters"]["required"] == ["path", "content"]


async def test_tool_results_are_sent_back_in_wire_format(nursery: trio.Nursery) -> None:
    fake, base_url = await start_fake(nursery, StreamedTurn("All done."))
    call = ToolCallRequest("abc", "list_files", "{}")
    conversation = [*CONVERSATION, ConversationMessage("assistant", "", (call,)),
                    ConversationMessage("tool", '{"result": {"files": []}}', call_id="abc")]

    turn = await OpenAIChatBackend(base_url, "m", "", timeout=5).next_turn(conversation, [])

    assert turn.finished and turn.text == "All done."
    body = fake.requests[0].body
    assert "tools" not in body and "authorization" not in fake.requests[0].headers
    assert body["messages"][2:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "abc", "type": "function",
             "function": {"name": "list_files", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "abc", "content": '{"result": {"files": []}}'},
    ]


async def test_http_error_names_the_status_and_hides_the_key(nursery: trio.Nursery) -> None:
    _, base_url = await start_fake(nursery, HttpFailure(500, "boom", echo_authorization=True))
    with pytest.raises(ModelBackendError, match="HTTP 500: boom") as caught:
        await OpenAIChatBackend(base_url, "m", API_KEY, timeout=5).next_turn(CONVERSATION, [])
    assert API_KEY not in str(caught.value)
    assert "[redacted]" in str(caught.value)


async def test_a_stalled_endpoint_times_out(nursery: trio.Nursery) -> None:
    _, base_url = await start_fake(nursery, Stall(10))
    with trio.fail_after(3), pytest.raises(ModelBackendError, match="timed out"):
        await OpenAIChatBackend(base_url, "m", API_KEY, timeout=0.3).next_turn(CONVERSATION, [])


async def test_an_unreachable_endpoint_is_a_backend_error() -> None:
    port = free_port()  # nothing listens on it
    backend = OpenAIChatBackend(f"http://127.0.0.1:{port}/v1", "m", API_KEY, timeout=2)
    with pytest.raises(ModelBackendError, match="ConnectError") as caught:
        await backend.next_turn(CONVERSATION, [])
    assert API_KEY not in str(caught.value)


@pytest.mark.parametrize(("reply", "message"), [
    (RawReply(["data: {not json"]), "malformed chunk"),
    (RawReply(['data: {"choices": "none"}']), "no list of choices"),
    (RawReply(['data: {"choices": [{"delta": {"content": "half"}, "finish_reason": null}]}']),
     "ended before the reply was finished"),
    (RawReply(['data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": '
               '{"arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}']),
     "without a name"),
    (RawReply(['data: {"choices": [{"delta": {"tool_calls": [{"function": {}}]}}]}']),
     "without an index"),
    (RawReply(['{"choices": []}'], content_type="application/json"), "event stream"),
])
async def test_malformed_replies_are_backend_errors(
    nursery: trio.Nursery, reply: RawReply, message: str
) -> None:
    _, base_url = await start_fake(nursery, reply)
    with pytest.raises(ModelBackendError, match=message):
        await OpenAIChatBackend(base_url, "m", API_KEY, timeout=5).next_turn(CONVERSATION, [])
