// llama.cpp's chat-output parsing, as a command: JSON requests on stdin, JSON results on stdout.  DEV-ONLY.
//
// Built by tests/support/llamacpp_chat_parse.py from the same common/ sources of the pinned sdist as
// scripts/chat_template_driver.cpp, so that the tool-call tests can read a model's reply as llama.cpp
// does: common_chat_templates_apply fills the parser for the template and the request (as
// tools/server/server-common.cpp does), and common_chat_peg_parse reads each reply with it (as
// tests/test-chat.cpp's peg_test_case does).  elelem never links it.
//
// stdin:  {"requests": [{"template", "bos_token", "eos_token", "messages", "tools", "tool_choice",
//                        "parallel_tool_calls", "reasoning_format" (default "auto"), "enable_thinking",
//                        "replies": [text, ...]}, ...]}
// stdout: {"results": [{"format", "generation_prompt", "parsed": [<message or {"error"}>, ...]} | {"error"}]}
// A parsed message is OpenAI's shape (common_chat_msg::to_json_oaicompat).

#include "chat.h"
#include "chat-peg-parser.h"
#include "common.h"
#include "json.h"
#include "log.h"
#include "peg-parser.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

using json = common_json;

static std::string str_or(const json & req, const char * key, const std::string & def) {
    return req.contains(key) && req.at(key).is_string() ? req.at(key).get<std::string>() : def;
}

static bool bool_or(const json & req, const char * key, bool def) {
    return req.contains(key) && req.at(key).is_boolean() ? req.at(key).get<bool>() : def;
}

static json handle(const json & req) {
    const std::string source = str_or(req, "template", "");
    auto tmpls = common_chat_templates_init(/* model= */ nullptr, source.empty() ? "chatml" : source,
                                            str_or(req, "bos_token", ""), str_or(req, "eos_token", ""));
    const json empty_array = json::array();
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat(req.contains("messages") ? req.at("messages") : empty_array);
    inputs.tools    = common_chat_tools_parse_oaicompat(req.contains("tools") ? req.at("tools") : json());
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(str_or(req, "tool_choice", "auto"));
    auto caps = common_chat_templates_get_caps(tmpls.get());
    inputs.parallel_tool_calls   = bool_or(req, "parallel_tool_calls", caps["supports_parallel_tool_calls"]);
    inputs.add_generation_prompt = true;
    inputs.use_jinja             = true;
    inputs.reasoning_format      = common_reasoning_format_from_name(str_or(req, "reasoning_format", "auto"));
    inputs.enable_thinking       = bool_or(req, "enable_thinking", true);

    common_chat_params params = common_chat_templates_apply(tmpls.get(), inputs);
    common_peg_arena arena;
    if (!params.parser.empty()) {
        arena.load(params.parser);
    }
    common_chat_parser_params pp(params);
    pp.reasoning_format = inputs.reasoning_format;

    json parsed = json::array();
    for (const auto & reply : req.at("replies")) {
        try {
            common_chat_msg msg = params.parser.empty()
                ? common_chat_parse(reply.get<std::string>(), /* is_partial= */ false, pp)
                : common_chat_peg_parse(arena, reply.get<std::string>(), /* is_partial= */ false, pp);
            parsed.push_back(msg.to_json_oaicompat());
        } catch (const std::exception & e) {
            json err = json::object();
            err["error"] = std::string(e.what());
            parsed.push_back(err);
        }
    }
    json out = json::object();
    out["format"]            = std::string(common_chat_format_name(params.format));
    out["generation_prompt"] = params.generation_prompt;
    out["parsed"]            = parsed;
    return out;
}

int main() {
    common_log_set_verbosity_thold(-1);
    if (!freopen("/dev/null", "w", stderr)) {
        return 2;
    }
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    json results = json::array();
    try {
        const json doc = json::parse(input);
        for (const auto & req : doc.at("requests")) {
            try {
                results.push_back(handle(req));
            } catch (const std::exception & e) {
                json err = json::object();
                err["error"] = std::string(e.what());
                results.push_back(err);
            }
        }
    } catch (const std::exception & e) {
        std::cout << "{\"error\": " << json(std::string("bad input JSON: ") + e.what()).dump() << "}\n";
        return 1;
    }
    json out = json::object();
    out["results"] = results;
    std::cout << out.dump_safe() << "\n";
    return 0;
}
