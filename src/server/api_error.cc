#include "server/api_error.h"

namespace kiln::server {

const char* error_type_for(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json error_body(int status, const std::string& message, const std::string& param, const std::string& type,
                          const std::string& code) {
  nlohmann::json e = {{"message", message},
                      {"type", type.empty() ? error_type_for(status) : type},
                      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                      {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  return {{"error", e}};
}

}  // namespace kiln::server
