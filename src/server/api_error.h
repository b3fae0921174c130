// An error answered to an API client: the HTTP status and the OpenAI error body
// {"error":{"message","type","param","code"}}. Thrown by request validation, caught by the router,
// so a bad request never reaches the engine and never takes the server down.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace kiln::server {

struct ApiError : std::runtime_error {
  ApiError(int status_, std::string message_, std::string param_ = {}, std::string type_ = {}, std::string code_ = {})
      : std::runtime_error(message_),
        status(status_),
        message(std::move(message_)),
        param(std::move(param_)),
        type(std::move(type_)),
        code(std::move(code_)) {}
  int status;
  std::string message;  // what(), whole: a client's text may hold NUL bytes, which what() stops at
  std::string param, type, code;
};

// The OpenAI error type for an HTTP status ("invalid_request_error", "authentication_error", ...).
const char* error_type_for(int status);

nlohmann::json error_body(int status, const std::string& message, const std::string& param = {},
                          const std::string& type = {}, const std::string& code = {});
inline nlohmann::json error_body(const ApiError& e) {
  return error_body(e.status, e.message, e.param, e.type, e.code);
}

}  // namespace kiln::server
