#include "server/prompt_budget.h"

#include <limits>
#include <string>

namespace kiln::server {

size_t PromptBudget::max_prompt_bytes() const {
  constexpr size_t kNormalizerSlack = 4;
  const size_t per_position = kNormalizerSlack * (max_token_bytes == 0 ? 1 : max_token_bytes);
  const auto positions = static_cast<size_t>(context > 0 ? context : 0);
  if (positions > std::numeric_limits<size_t>::max() / per_position) return std::numeric_limits<size_t>::max();
  return positions * per_position;
}

size_t rendered_content_bytes(const nlohmann::ordered_json& messages) {
  size_t bytes = 0;
  if (!messages.is_array()) return 0;
  for (const auto& m : messages) {
    if (!m.is_object()) continue;
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string() || *role == "assistant") continue;
    const auto content = m.find("content");
    if (content != m.end() && content->is_string()) bytes += content->get_ref<const std::string&>().size();
  }
  return bytes;
}

}  // namespace kiln::server
