"""An agent loop: the model calls two Python functions as tools until it can answer.

Run from the repository root: ``python examples/agent_loop.py ["your question"]``
(uses the default model, qwen2.5-coder-0.5b, pulled on first use).

The loop is the OpenAI one:

1. send the conversation and the tools with ``create_chat_completion``;
2. if the reply has ``tool_calls`` (``finish_reason == "tool_calls"``), run
   each call, append the assistant message and one ``{"role": "tool",
   "tool_call_id", "content"}`` message per call, and go back to 1;
3. otherwise the reply's ``content`` is the answer.

The first step uses ``tool_choice="required"`` (a constrained call whose
arguments always parse and match the schema).  Later steps use ``"auto"``
with ``--chain`` (the model may call more tools, e.g. convert the
temperature it got), else ``"none"``; the last allowed step is always
``"none"``, so the loop ends with text.  The default 0.5B model tends to
repeat its call instead of answering in ``"auto"``, hence the default.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run against the source tree

from elelem import LLM  # noqa: E402


def get_weather(city: str) -> dict:
    """The current weather in a city (made up: this is an example)."""
    table = {"paris": ("sunny", 18), "london": ("rainy", 12), "tokyo": ("cloudy", 22)}
    conditions, celsius = table.get(city.lower(), ("clear", 20))
    return {"city": city, "conditions": conditions, "temperature_c": celsius}


def convert_temperature(celsius: float, to: str) -> dict:
    """A temperature in Celsius, converted to "fahrenheit" or "kelvin"."""
    value = celsius * 9 / 5 + 32 if to == "fahrenheit" else celsius + 273.15
    return {"celsius": celsius, to: round(value, 1)}


FUNCTIONS = {f.__name__: f for f in (get_weather, convert_temperature)}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": get_weather.__doc__,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_temperature", "description": convert_temperature.__doc__,
        "parameters": {"type": "object", "properties": {
            "celsius": {"type": "number"}, "to": {"enum": ["fahrenheit", "kelvin"]}},
            "required": ["celsius", "to"]}}},
]


def run_call(call: dict) -> str:
    function = FUNCTIONS.get(call["function"]["name"])
    try:
        arguments = json.loads(call["function"]["arguments"])
        result = function(**arguments) if function else {"error": "no such tool"}
    except (TypeError, ValueError) as error:  # the model's arguments did not fit the function
        result = {"error": str(error)}
    return json.dumps(result)


def agent(llm: LLM, question: str, max_steps: int = 4, chain: bool = False) -> str:
    messages = [{"role": "user", "content": question}]
    for step in range(max_steps):
        last = step == max_steps - 1
        choice = "required" if step == 0 else "auto" if chain and not last else "none"
        response = llm.create_chat_completion(messages, tools=TOOLS, tool_choice=choice,
                                              temperature=0, max_tokens=120)
        message = response["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            return message["content"] or ""
        for call in message["tool_calls"]:
            result = run_call(call)
            print(f"  -> {call['function']['name']}({call['function']['arguments']}) = {result}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return messages[-1].get("content") or ""


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--chain"]
    question = args[0] if args else "What is the weather in Paris?"
    with LLM() as model:
        print(f"user: {question}")
        print(f"assistant: {agent(model, question, chain='--chain' in sys.argv)}")
