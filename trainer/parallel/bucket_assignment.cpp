#include "trainer/parallel/bucket_assignment.h"

#include <algorithm>

namespace partrain {

namespace {

// How many elements bucket `index` may hold.
std::size_t cap_elements(const BucketCaps& caps, std::size_t element_bytes, std::size_t index) {
  const double mb = index == 0 ? std::min(caps.first_bucket_mb, caps.bucket_mb) : caps.bucket_mb;
  return std::max<std::size_t>(1, static_cast<std::size_t>(mb * 1024 * 1024) / element_bytes);
}

}  // namespace

std::vector<BucketLayout> assign_buckets(const std::vector<std::size_t>& element_counts,
                                         std::size_t element_bytes, const BucketCaps& caps) {
  std::vector<BucketLayout> buckets;
  for (std::size_t k = element_counts.size(); k-- > 0;) {
    const std::size_t n = element_counts[k];
    // An empty bucket takes any parameter, so one larger than the cap still finds a place.
    const bool full =
        !buckets.empty() && buckets.back().elements > 0 &&
        buckets.back().elements + n > cap_elements(caps, element_bytes, buckets.size() - 1);
    if (buckets.empty() || full) buckets.emplace_back();
    BucketLayout& bucket = buckets.back();
    bucket.params.push_back(k);
    bucket.offsets.push_back(bucket.elements);
    bucket.elements += n;
  }
  return buckets;
}

}  // namespace partrain
