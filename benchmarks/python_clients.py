"""The Python agent frameworks and clients users point at a local server, each on a small tool task against a running
``specwise serve``: the openai client (chat completions and Responses), instructor (TOOLS mode), langchain-openai
(``bind_tools`` with a named tool), pydantic-ai, smolagents, litellm, the OpenAI Agents SDK (chat completions and
Responses) and the anthropic client (Messages). Not run in CI: the clients are installed in a virtual environment
of their own, e.g.::

    python -m venv /root/agent-venvs/pyclients
    /root/agent-venvs/pyclients/bin/pip install instructor langchain-openai 'pydantic-ai-slim[openai]' smolagents \\
        litellm openai-agents anthropic
    specwise serve --target FILE.gguf --port 8000 &
    /root/agent-venvs/pyclients/bin/python benchmarks/python_clients.py --url http://127.0.0.1:8000 \\
        --model NAME --out benchmarks/results/agents_e2e/python_clients.json

Each client reports ``completed`` (it got an answer of the expected shape: a call of the weather tool, or a final
text), ``protocol_error`` (an exception from the client or the server: what this script is for; a model that answers
poorly is not one) and seconds. The script never fails on a client's error: it records it and goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

QUESTION = "What is the weather like in Paris today? Use the get_weather tool."
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"}},
    "required": ["location"],
    "additionalProperties": False,
}


def get_weather(location: str) -> str:
    """Get the current weather for a location (city and country)."""
    return f"sunny, 21 C in {location}"


def weather_tool() -> dict:
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get current temperature for a given location.",
            "parameters": WEATHER_SCHEMA,
            "strict": True,
        },
    }


# ------------------------------------------------------------------------------------------------- the clients


def openai_chat(url: str, model: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="sk-local")
    messages = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(
        model=model, messages=messages, tools=[weather_tool()], tool_choice="required", temperature=0
    )
    call = reply.choices[0].message.tool_calls[0]
    messages += [reply.choices[0].message.model_dump(exclude_none=True)]
    args = json.loads(call.function.arguments)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)})
    text = ""
    stream = client.chat.completions.create(
        model=model, messages=messages, tools=[weather_tool()], stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return f"call {args}; then {text[:80]!r}"


def openai_responses(url: str, model: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="sk-local")
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}
    first = client.responses.create(model=model, input=QUESTION, tools=[tool], tool_choice="required")
    call = next(item for item in first.output if item.type == "function_call")
    follow = [*[item.model_dump(exclude_none=True) for item in first.output]]
    follow.append({"type": "function_call_output", "call_id": call.call_id, "output": get_weather("Paris")})
    second = client.responses.create(model=model, input=[{"role": "user", "content": QUESTION}, *follow])
    return f"call {call.arguments}; then {second.output_text[:80]!r}"


def instructor_tools(url: str, model: str) -> str:
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class Weather(BaseModel):
        location: str

    client = instructor.from_openai(OpenAI(base_url=f"{url}/v1", api_key="sk-local"), mode=instructor.Mode.TOOLS)
    found = client.chat.completions.create(
        model=model, response_model=Weather, messages=[{"role": "user", "content": QUESTION}], max_retries=0
    )
    return f"{found!r}"


def langchain_bind_tools(url: str, model: str) -> str:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def weather(location: str) -> str:
        """Get the current weather for a location (city and country)."""
        return get_weather(location)

    llm = ChatOpenAI(model=model, base_url=f"{url}/v1", api_key="sk-local", temperature=0)
    reply = llm.bind_tools([weather], tool_choice="weather").invoke(QUESTION)
    if not reply.tool_calls:
        raise RuntimeError(f"no tool call: {reply!r}")
    return f"{reply.tool_calls}"


def pydantic_ai_agent(url: str, model: str) -> str:
    from pydantic_ai import Agent

    try:
        from pydantic_ai.models.openai import OpenAIChatModel as ChatModel
    except ImportError:  # older releases
        from pydantic_ai.models.openai import OpenAIModel as ChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    chat = ChatModel(model, provider=OpenAIProvider(base_url=f"{url}/v1", api_key="sk-local"))
    agent = Agent(chat, tools=[get_weather], system_prompt="Answer with the tools you have.")
    result = agent.run_sync(QUESTION)
    return f"{str(result.output)[:120]!r}"


def smolagents_agent(url: str, model: str) -> str:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def weather(location: str) -> str:
        """Get the current weather for a location.

        Args:
            location: city and country, e.g. Paris, France
        """
        return get_weather(location)

    agent = ToolCallingAgent(
        tools=[weather], model=OpenAIServerModel(model, api_base=f"{url}/v1", api_key="sk-local"), max_steps=3
    )
    return f"{str(agent.run(QUESTION))[:120]!r}"


def litellm_completion(url: str, model: str) -> str:
    import litellm

    reply = litellm.completion(
        model=f"openai/{model}",
        api_base=f"{url}/v1",
        api_key="sk-local",
        messages=[{"role": "user", "content": QUESTION}],
        tools=[weather_tool()],
        tool_choice="required",
    )
    return f"{reply.choices[0].message.tool_calls}"


def agents_sdk(url: str, model: str, responses: bool) -> str:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-local")
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather", instructions="Answer with the tools you have.", tools=[function_tool(get_weather)],
        model=kind(model=model, openai_client=client),
    )  # fmt: skip
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=3))
    return f"{str(result.final_output)[:120]!r}"


def anthropic_messages(url: str, model: str) -> str:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-local")
    tool = {"name": "get_weather", "description": "Get the current weather.", "input_schema": WEATHER_SCHEMA}
    first = client.messages.create(
        model=model, max_tokens=128, messages=[{"role": "user", "content": QUESTION}], tools=[tool],
        tool_choice={"type": "any"},
    )  # fmt: skip
    use = next(block for block in first.content if block.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": get_weather(**use.input)}
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [result]},
    ]
    with client.messages.stream(model=model, max_tokens=128, messages=messages, tools=[tool]) as stream:
        final = stream.get_final_message()
    return f"tool_use {use.input}; then {final.stop_reason}"


CLIENTS = {
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "instructor": instructor_tools,
    "langchain-openai": langchain_bind_tools,
    "pydantic-ai": pydantic_ai_agent,
    "smolagents": smolagents_agent,
    "litellm": litellm_completion,
    "openai-agents-chat": lambda url, model: agents_sdk(url, model, False),
    "openai-agents-responses": lambda url, model: agents_sdk(url, model, True),
    "anthropic": anthropic_messages,
}


def run(name: str, url: str, model: str) -> dict:
    began = time.perf_counter()
    try:
        answer = CLIENTS[name](url, model)
        return {"client": name, "completed": True, "protocol_error": None, "answer": answer,
                "seconds": round(time.perf_counter() - began, 1)}  # fmt: skip
    except ModuleNotFoundError as err:
        return {"client": name, "completed": False, "protocol_error": None, "skipped": f"not installed: {err.name}"}
    except Exception as err:  # what this script is for: a client that fails, and why
        return {
            "client": name, "completed": False, "protocol_error": f"{type(err).__name__}: {err}"[:2000],
            "trace": traceback.format_exc()[-3000:], "seconds": round(time.perf_counter() - began, 1),
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model's id (GET /v1/models)")
    parser.add_argument("--clients", nargs="*", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--server-command", default=None, help="how the server was started, for the report")
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-local")
    results = []
    for name in args.clients:
        result = run(name, args.url, args.model)
        print(json.dumps(result)[:400], flush=True)
        results.append(result)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "")
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "server_command": args.server_command,
        "cpu": model_name,
        "python": platform.python_version(),
        "results": results,
        "completed": sum(r["completed"] for r in results),
        "protocol_errors": sum(r.get("protocol_error") is not None for r in results),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['completed']} completed, {report['protocol_errors']} protocol errors")


if __name__ == "__main__":
    main()
