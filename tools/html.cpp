#include "report.h"

namespace cupool::tools {

std::string report_html(const Analysis& a) {
  return "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cupool report</title></head><body><pre>" +
         report_text(a) + "</pre></body></html>\n";
}

}  // namespace cupool::tools
