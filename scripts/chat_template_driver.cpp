// llama.cpp's chat templating, as a command: JSON requests on stdin, JSON results on stdout.  DEV-ONLY.
//
// Built by scripts/reference_chat_templates.py from the common/ sources of the
// llama-cpp-python sdist that scripts/reference_llamacpp.py builds (its own
// libllama), so that the tests can render a chat template exactly as llama.cpp
// does: its C++ Jinja engine (common/jinja/) behind its chat-format code
// (common/chat.cpp: common_chat_templates_init / common_chat_templates_apply,
// the way tools/server/server-common.cpp calls them).  elelem never links it.
//
// stdin:  {"now": <unix seconds, optional>, "requests": [<request>, ...]}
// stdout: {"results": [<result>, ...]}, one result per request, in order.
//
// A request is an object with a "mode":
//
//   "apply"  -- what llama-server does with a chat request.  Keys: "template" (the Jinja source),
//               "bos_token", "eos_token", and the request body's own: "messages", "tools",
//               "tool_choice", "parallel_tool_calls", "add_generation_prompt" (default true),
//               "chat_template_kwargs" (name -> JSON value), "reasoning_format" (default "none"),
//               "reasoning_effort", "enable_thinking" (the server's --reasoning on/off default, true).
//               Result: "prompt", "format" (common_chat_format_name), "handler" (the specialized
//               template llama.cpp chose, "autoparser" or ""), "generation_prompt",
//               "supports_thinking", "thinking_start_tag", "thinking_end_tags", "grammar_lazy",
//               "grammar", "grammar_triggers", "preserved_tokens", "additional_stops", "caps" (the
//               template's capabilities as llama.cpp detects them), and "context": the variables the
//               Jinja engine rendered "prompt" from (checked: rendering them again gives "prompt";
//               null when no captured set does), and "patched_template" when llama.cpp patched the
//               source before rendering it (common_chat_templates_init: gpt-oss's and Mistral's).
//   "render" -- the Jinja engine alone: "template" rendered with the variables of "context" (an
//               object), nothing added.  Result: "prompt".
//   "legacy" -- llama_chat_apply_template (libllama's built-in, non-Jinja templates): "template"
//               (a name or a Jinja source it recognises), "messages" (role/content strings),
//               "add_generation_prompt".  Result: "prompt".
//
// A request that fails gives {"error": "<message>"}.
//
// Time: llama.cpp reads the clock in two places, std::time() for strftime_now() (jinja::context)
// and std::chrono::system_clock::now() for the "datetime" and "date_string" variables
// (common_chat_extra_context).  With "now" (per request or for the whole batch) the first is
// replaced by defining time() in this executable, and the second by passing "datetime" and
// "date_string" made from "now" with llama.cpp's own formats as chat_template_kwargs (which
// llama.cpp applies after them), unless the request gives them.  TZ is UTC.

#include "chat.h"
#include "common.h"
#include "jinja/caps.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "jinja/value.h"
#include "json.h"
#include "llama.h"
#include "log.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

using json = common_json;

// --- the clock ----------------------------------------------------------------------------

static bool   g_fixed_now = false;
static time_t g_now       = 0;

// Replaces libc's time() for this executable (the jinja context reads the time through it).
extern "C" time_t time(time_t * out) {
    time_t t = g_now;
    if (!g_fixed_now) {
        timespec ts{};
        clock_gettime(CLOCK_REALTIME, &ts);
        t = ts.tv_sec;
    }
    if (out) {
        *out = t;
    }
    return t;
}

static std::string format_now(const char * format) {
    time_t t = time(nullptr);
    char buf[128];
    std::tm tm_local = *std::localtime(&t);
    return std::strftime(buf, sizeof(buf), format, &tm_local) ? std::string(buf) : std::string();
}

// --- capturing the variables the engine renders with -----------------------------------------

// jinja::global_from_json<common_json>, wrapped by the linker (-Wl,--wrap=<this symbol>): every
// set of variables llama.cpp hands the engine is recorded, with what it set on the context before.
#define GLOBAL_FROM_JSON "_ZN5jinja16global_from_jsonI11common_jsonEEvRNS_7contextERKT_b"
void real_global_from_json(jinja::context & ctx, const json & obj, bool mark_input) __asm__("__real_" GLOBAL_FROM_JSON);
void wrap_global_from_json(jinja::context & ctx, const json & obj, bool mark_input) __asm__("__wrap_" GLOBAL_FROM_JSON);

static bool              g_capture = false;
static std::vector<json> g_captured;

// Variables llama.cpp's caps helpers set on the context itself (jinja/caps.cpp).
static const char * CONTEXT_VARIABLES[] = {
    "reasoning_effort", "reasoning_strength", "preserve_thinking", "clear_thinking",
    "truncate_history_thinking", "drop_thinking",
};

void wrap_global_from_json(jinja::context & ctx, const json & obj, bool mark_input) {
    if (g_capture) {
        json seen = obj;
        for (const char * name : CONTEXT_VARIABLES) {
            if (seen.contains(name)) {
                continue;
            }
            jinja::value v = ctx.get_val(name);
            if (jinja::is_val<jinja::value_bool>(v)) {
                seen[name] = v->as_bool();
            } else if (jinja::is_val<jinja::value_string>(v)) {
                seen[name] = v->as_string().str();
            }
        }
        g_captured.push_back(seen);
    }
    real_global_from_json(ctx, obj, mark_input);
}

// --- rendering ------------------------------------------------------------------------------

static std::string render_raw(const std::string & source, const json & context) {
    jinja::lexer lexer;
    auto tokens = lexer.tokenize(source);
    jinja::program prog = jinja::parse_from_tokens(tokens);
    jinja::context ctx(tokens.source);
    jinja::global_from_json(ctx, context, /* mark_input= */ true);
    jinja::runtime runtime(ctx);
    const jinja::value results = runtime.execute(prog);
    return jinja::runtime::gather_string_parts(results)->as_string().str();
}

static std::string str_or(const json & req, const char * key, const std::string & def) {
    return req.contains(key) && req.at(key).is_string() ? req.at(key).get<std::string>() : def;
}

static bool bool_or(const json & req, const char * key, bool def) {
    return req.contains(key) && req.at(key).is_boolean() ? req.at(key).get<bool>() : def;
}

// The log file llama.cpp's debug messages go to; "handler" is read from it.
static std::string g_log_path;
static std::streamoff g_log_offset = 0;

static std::string new_log_text() {
    common_log_flush(common_log_main());
    std::ifstream in(g_log_path, std::ios::binary);
    in.seekg(g_log_offset);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    g_log_offset += (std::streamoff) text.size();
    return text;
}

static std::string handler_from_log(const std::string & log) {
    const std::string marker = "Using specialized template: ";
    auto at = log.find(marker);
    if (at != std::string::npos) {
        auto end = log.find('\n', at);
        return log.substr(at + marker.size(), end == std::string::npos ? std::string::npos : end - at - marker.size());
    }
    if (log.find("using differential autoparser") != std::string::npos) {
        return "autoparser";
    }
    return "";
}

static json apply(const json & req) {
    const std::string source = str_or(req, "template", "");
    auto tmpls = common_chat_templates_init(/* model= */ nullptr, source.empty() ? "chatml" : source,
                                            str_or(req, "bos_token", ""), str_or(req, "eos_token", ""));
    const json empty_array = json::array();
    // As tools/server/server-common.cpp (oaicompat_chat_params_parse) fills the inputs.
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat(req.contains("messages") ? req.at("messages") : empty_array);
    inputs.tools    = common_chat_tools_parse_oaicompat(req.contains("tools") ? req.at("tools") : json());
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(str_or(req, "tool_choice", "auto"));
    auto caps = common_chat_templates_get_caps(tmpls.get());
    inputs.parallel_tool_calls   = bool_or(req, "parallel_tool_calls", caps["supports_parallel_tool_calls"]);
    inputs.add_generation_prompt = bool_or(req, "add_generation_prompt", true);
    inputs.use_jinja             = true;
    inputs.reasoning_format      = common_reasoning_format_from_name(str_or(req, "reasoning_format", "none"));
    inputs.enable_thinking       = bool_or(req, "enable_thinking", true);
    if (req.contains("chat_template_kwargs")) {
        for (const auto & [key, value] : req.at("chat_template_kwargs").items()) {
            inputs.chat_template_kwargs[key] = value.dump();
        }
    }
    auto enable_thinking_kwarg = inputs.chat_template_kwargs.count("enable_thinking")
        ? inputs.chat_template_kwargs["enable_thinking"] : std::string();
    if (enable_thinking_kwarg == "true") {
        inputs.enable_thinking = true;
    } else if (enable_thinking_kwarg == "false") {
        inputs.enable_thinking = false;
    }
    const std::string effort = str_or(req, "reasoning_effort", "");
    if (effort == "none") {
        inputs.enable_thinking = false;
        inputs.chat_template_kwargs.erase("reasoning_effort");
    } else if (!effort.empty()) {
        inputs.chat_template_kwargs["reasoning_effort"] = json(effort).dump();
    }
    if (g_fixed_now) {
        // common_chat_extra_context()'s variables, at "now" (chat.cpp: format_time with these formats)
        if (!inputs.chat_template_kwargs.count("datetime")) {
            inputs.chat_template_kwargs["datetime"] = json(format_now("%b %d %Y")).dump();
        }
        if (!inputs.chat_template_kwargs.count("date_string")) {
            inputs.chat_template_kwargs["date_string"] = json(format_now("%d %b %Y")).dump();
        }
    }

    new_log_text();
    g_captured.clear();
    g_capture = true;
    common_chat_params params;
    try {
        params = common_chat_templates_apply(tmpls.get(), inputs);
    } catch (...) {
        g_capture = false;
        throw;
    }
    g_capture = false;
    const std::string log = new_log_text();

    json out = json::object();
    out["prompt"]             = params.prompt;
    out["format"]             = std::string(common_chat_format_name(params.format));
    out["handler"]            = handler_from_log(log);
    out["generation_prompt"]  = params.generation_prompt;
    out["supports_thinking"]  = params.supports_thinking;
    out["thinking_start_tag"] = params.thinking_start_tag;
    out["thinking_end_tags"]  = params.thinking_end_tags;
    out["grammar_lazy"]       = params.grammar_lazy;
    out["grammar"]            = params.grammar;
    json triggers = json::array();
    for (const auto & trigger : params.grammar_triggers) {
        json t = json::object();
        t["type"]  = (int) trigger.type;
        t["value"] = trigger.value;
        triggers.push_back(t);
    }
    out["grammar_triggers"] = triggers;
    out["preserved_tokens"] = params.preserved_tokens;
    out["additional_stops"] = params.additional_stops;
    json caps_json = json::object();
    for (const auto & [name, value] : caps) {
        caps_json[name] = value;
    }
    out["caps"] = caps_json;

    // The captured variables the prompt was rendered from: the first set that renders to it.
    // (llama.cpp also renders probes while it analyses a template; those do not match.)
    const std::string rendered_source = common_chat_templates_source(tmpls.get());
    out["context"] = json();
    std::vector<json> captured = g_captured;
    for (const auto & context : captured) {
        try {
            if (render_raw(rendered_source, context) == params.prompt) {
                out["context"] = context;
                break;
            }
        } catch (const std::exception &) {
            // a probe that fails on its own; not the one
        }
    }
    // the source after llama.cpp's own patches (common_chat_templates_init), when it changed it
    // (beyond the lexer's own normalization: one trailing newline dropped, as jinja2 does)
    if (!source.empty() && rendered_source != jinja::lexer().tokenize(source).source) {
        out["patched_template"] = rendered_source;
    }
    return out;
}

static json legacy(const json & req) {
    std::vector<std::string> roles, contents;
    const json & messages = req.at("messages");
    for (size_t i = 0; i < messages.size(); i++) {
        roles.push_back(messages.at(i).at("role").get<std::string>());
        contents.push_back(messages.at(i).contains("content") && messages.at(i).at("content").is_string()
                               ? messages.at(i).at("content").get<std::string>() : std::string());
    }
    std::vector<llama_chat_message> chat;
    for (size_t i = 0; i < roles.size(); i++) {
        chat.push_back({roles[i].c_str(), contents[i].c_str()});
    }
    const std::string source = str_or(req, "template", "");
    const bool add_ass = bool_or(req, "add_generation_prompt", true);
    std::vector<char> buf(1 << 16);
    int32_t n = llama_chat_apply_template(source.c_str(), chat.data(), chat.size(), add_ass, buf.data(), (int32_t) buf.size());
    if (n > (int32_t) buf.size()) {
        buf.resize(n);
        n = llama_chat_apply_template(source.c_str(), chat.data(), chat.size(), add_ass, buf.data(), (int32_t) buf.size());
    }
    if (n < 0) {
        throw std::runtime_error("llama_chat_apply_template: this template is not supported (" + std::to_string(n) + ")");
    }
    json out = json::object();
    out["prompt"] = std::string(buf.data(), n);
    return out;
}

static json handle(const json & req, const json & batch_now) {
    const json & now = req.contains("now") ? req.at("now") : batch_now;
    g_fixed_now = now.is_number();
    g_now = g_fixed_now ? (time_t) now.get<int64_t>() : 0;
    const std::string mode = str_or(req, "mode", "apply");
    if (mode == "apply") {
        return apply(req);
    }
    if (mode == "render") {
        json out = json::object();
        out["prompt"] = render_raw(str_or(req, "template", ""), req.at("context"));
        return out;
    }
    if (mode == "legacy") {
        return legacy(req);
    }
    throw std::runtime_error("unknown mode: " + mode);
}

int main(int argc, char ** argv) {
    setenv("TZ", "UTC0", 1);
    tzset();
    const bool verbose = argc > 1 && std::string(argv[1]) == "--verbose";

    char log_path[] = "/tmp/chat_template_driver-XXXXXX";
    int fd = mkstemp(log_path);
    if (fd < 0) {
        perror("mkstemp");
        return 2;
    }
    close(fd);
    g_log_path = log_path;
    common_log_set_file(common_log_main(), log_path);
    common_log_set_verbosity_thold(LOG_LEVEL_DEBUG);  // the specialized template's name is a debug message
    if (!verbose) {
        // the debug messages also go to stderr, with the analyses of every template: keep it quiet
        if (!freopen("/dev/null", "w", stderr)) {
            return 2;
        }
    }

    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    json doc;
    try {
        doc = json::parse(input);
    } catch (const std::exception & e) {
        std::cout << "{\"error\": " << json(std::string("bad input JSON: ") + e.what()).dump() << "}\n";
        unlink(log_path);
        return 1;
    }
    const json batch_now = doc.contains("now") ? doc.at("now") : json();
    json results = json::array();
    const json & requests = doc.at("requests");
    for (size_t i = 0; i < requests.size(); i++) {
        try {
            results.push_back(handle(requests.at(i), batch_now));
        } catch (const std::exception & e) {
            json err = json::object();
            err["error"] = std::string(e.what());
            results.push_back(err);
        }
    }
    json out = json::object();
    out["results"] = results;
    std::cout << out.dump_safe() << "\n";
    common_log_flush(common_log_main());
    unlink(log_path);
    return 0;
}
