"""The three conversations of the template corpus check, as OpenAI chat requests.

Standard library only.  tests/support/llamacpp_templates.py hands each, with every
template of llama.cpp's corpus (models/templates/*.jinja of the pinned sdist),
to llama.cpp's chat templating (scripts/chat_template_driver.cpp, which fills
llama.cpp's inputs as llama-server does from such a request), and
tests/test_template_corpus.py renders the same in elelem.  The requests are
what a client sends: a tool call's ``arguments`` as a JSON string, ``content``
None beside tool calls, ``reasoning_content`` on an assistant turn.
"""
from __future__ import annotations

import calendar
import datetime
import hashlib
import json

#: The clock of both renderers (strftime_now(), and llama.cpp's datetime / date_string variables), UTC.
FIXED_NOW = datetime.datetime(2026, 1, 15, 9, 30, 0)
FIXED_NOW_EPOCH = calendar.timegm(FIXED_NOW.timetuple())
BOS, EOS = "<s>", "</s>"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city — données météo.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current local time.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}}}},
]

#: name -> an OpenAI chat request body (the keys llama-server reads).
CONVERSATIONS = {
    "plain": {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And times 3?"},
        ],
        "add_generation_prompt": True,
    },
    "tool_round_trip": {
        "messages": [
            {"role": "system", "content": "You can check the weather."},
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call00001", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call00001", "name": "get_weather",
             "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    "reasoning": {
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."},
            {"role": "user", "content": "And times 3?"},
        ],
        "chat_template_kwargs": {"enable_thinking": True},
        "add_generation_prompt": True,
    },
}


def digest() -> str:
    """What a stored fixture must have been made from."""
    data = json.dumps({"conversations": CONVERSATIONS, "now": FIXED_NOW_EPOCH, "bos": BOS, "eos": EOS},
                      ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()
