"""Conversations for rendering the real chat templates of llama.cpp's models/templates/.

Standard library only: tests/support/fixtures/make_template_reference.py imports it under
the llama.cpp reference python, tests/test_templates_moe.py under elelem's.  The
conversations use the shapes these templates accept (tool call ids of 9
alphanumeric characters as Mistral's want, arguments as objects as GLM's and
Qwen3-Coder's want, "" rather than None as content next to tool calls);
None-valued keys are left out, as elelem (and transformers) drop them.
"""
from __future__ import annotations

import datetime
import hashlib
import json

#: strftime_now() returns this date in both renderers (gpt-oss and Mistral print today's date).
FIXED_NOW = datetime.datetime(2026, 1, 15, 9, 30, 0)
BOS, EOS = "<s>", "</s>"

SYSTEM_USER_ASSISTANT_USER = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And times 3?"},
]
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
TOOL_ROUND_TRIP = [
    {"role": "system", "content": "You can check the weather."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
]

#: name -> (messages, add_generation_prompt, extra variables)
CASES = {
    "plain": (SYSTEM_USER_ASSISTANT_USER, True, {}),
    "plain_no_generation_prompt": (SYSTEM_USER_ASSISTANT_USER[:3], False, {}),
    "user_only": ([{"role": "user", "content": "Hello!"}], True, {}),
    "unicode_and_markup": ([
        {"role": "user", "content": "Café ☕ — \"quotes\", <tags> & {{ braces }}\nsecond line\ttab"},
        {"role": "assistant", "content": "日本語で答えます。 🎉"},
        {"role": "user", "content": "  leading and trailing spaces  "},
    ], True, {}),
    "with_tools": (SYSTEM_USER_ASSISTANT_USER, True, {"tools": TOOLS}),
    "tool_round_trip": (TOOL_ROUND_TRIP, True, {"tools": TOOLS}),
    "reasoning_in_history": ([
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four.",
         "thinking": "Two plus two is four."},
        {"role": "user", "content": "And times 3?"},
    ], True, {}),
    "thinking_off": (SYSTEM_USER_ASSISTANT_USER, True, {"enable_thinking": False}),
    "thinking_on": (SYSTEM_USER_ASSISTANT_USER, True, {"enable_thinking": True}),
    "reasoning_effort_high": (SYSTEM_USER_ASSISTANT_USER, True, {"reasoning_effort": "high"}),
}

#: The templates of the mixture-of-experts models ( Qwen3-MoE / Qwen3-Coder, gpt-oss, GLM-4.5/4.6/4.7,
#: MiniMax-M2; Mistral 3 / Devstral / Magistral and Mistral Nemo for Tekken) and Gemma 4's, with what the
#: plain conversation's prompt must end with and contain.  Their renderings are stored in
#: full; the other templates' as digests.
IN_SCOPE = {
    "Qwen3-Coder.jinja": {"ends": "<|im_start|>assistant\n", "has": ["<|im_start|>system\nYou are a terse"]},
    "Qwen-Qwen3-0.6B.jinja": {"ends": "<|im_start|>assistant\n", "has": ["<|im_start|>user\nAnd times 3?<|im_end|>"]},
    "openai-gpt-oss-120b.jinja": {"ends": "<|start|>assistant",
                                  "has": ["<|channel|>final<|message|>4.<|end|>", "Current date: 2026-01-15"]},
    "GLM-4.6.jinja": {"ends": "<|assistant|>", "has": ["[gMASK]<sop>", "<|user|>\nAnd times 3?"]},
    "GLM-4.7-Flash.jinja": {"ends": "<|assistant|><think>", "has": ["[gMASK]<sop>"]},
    "MiniMax-M2.jinja": {"ends": "]~b]ai\n<think>\n", "has": ["]~b]user\nAnd times 3?[e~["]},
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": {"ends": "[INST]And times 3?[/INST]",
                                                  "has": ["[SYSTEM_PROMPT]You are a terse assistant.[/SYSTEM_PROMPT]"]},
    "unsloth-mistral-Devstral-Small-2507.jinja": {"ends": "[INST]And times 3?[/INST]", "has": ["[SYSTEM_PROMPT]"]},
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": {"ends": "[INST]And times 3?[/INST]",
                                                       "has": ["[SYSTEM_PROMPT]"]},
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": {"ends": "And times 3?[/INST]", "has": ["[INST]What is 2 + 2?[/INST]4."]},
    # Gemma 4: thinking off unless enable_thinking, which puts <|think|> in the system turn.
    "google-gemma-4-31B-it.jinja": {"ends": "<|turn>model\n<|channel>thought\n<channel|>",
                                    "has": ["<|turn>system\nYou are a terse assistant.<turn|>",
                                            "<|turn>user\nAnd times 3?<turn|>"]},
    "google-gemma-4-31B-it-interleaved.jinja": {"ends": "<|turn>model\n<|channel>thought\n<channel|>",
                                                "has": ["<|turn>model\n4.<turn|>"]},
}


def digest() -> str:
    """What a stored rendering fixture must have been made from."""
    data = json.dumps({"cases": CASES, "in_scope": sorted(IN_SCOPE), "now": FIXED_NOW.isoformat(),
                       "bos": BOS, "eos": EOS}, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
