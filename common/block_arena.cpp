#include "common/block_arena.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <sys/mman.h>
#endif

namespace partrain {
namespace {

char* map_memory(std::size_t bytes) {
#if defined(_WIN32)
  // Committed but not resident until touched, as an anonymous mapping is.
  return static_cast<char*>(VirtualAlloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE));
#else
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
#endif
}

void unmap_memory(char* at, std::size_t bytes) {
#if defined(_WIN32)
  (void)bytes;
  VirtualFree(at, 0, MEM_RELEASE);
#else
  munmap(at, bytes);
#endif
}

std::size_t round_up(std::size_t bytes, std::size_t granule) {
  return (bytes + granule - 1) & ~(granule - 1);
}

}  // namespace

BlockArena::BlockArena(std::size_t chunk, std::size_t granule)
    : chunk_(round_up(chunk, granule)), granule_(granule) {}

BlockArena::~BlockArena() {
  for (const auto& [at, bytes] : chunks_) unmap_memory(at, bytes);
}

void BlockArena::add_free(char* at, std::size_t bytes, char* chunk_end) {
  free_by_address_.emplace(at, Free{bytes, chunk_end});
  free_by_size_.emplace(bytes, at);
}

void* BlockArena::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_up(bytes, granule_);
  if (size < bytes) return nullptr;  // wrapped around
  std::lock_guard<std::mutex> lock(mutex_);
  auto fit = free_by_size_.lower_bound({size, nullptr});
  if (fit == free_by_size_.end()) {
    const std::size_t length = size > chunk_ ? size : chunk_;
    char* chunk = map_memory(length);
    if (chunk == nullptr) return nullptr;
    chunks_.emplace_back(chunk, length);
    mapped_ += length;
    add_free(chunk, length, chunk + length);
    fit = free_by_size_.find({length, chunk});
  }
  char* at = fit->second;
  const Free found = free_by_address_.at(at);
  free_by_size_.erase(fit);
  free_by_address_.erase(at);
  if (found.bytes > size) add_free(at + size, found.bytes - size, found.chunk_end);
  used_.emplace(at, std::make_pair(size, found.chunk_end));
  used_bytes_ += size;
  return at;
}

void BlockArena::free(void* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = used_.find(static_cast<char*>(block));
  if (it == used_.end()) return;  // not ours: never handed out, or given back twice
  char* at = it->first;
  std::size_t size = it->second.first;
  char* const chunk_end = it->second.second;
  used_.erase(it);
  used_bytes_ -= size;
  // The free block after this one, then the one before, join it when in the same chunk.
  const auto next = free_by_address_.find(at + size);
  if (next != free_by_address_.end() && next->second.chunk_end == chunk_end) {
    free_by_size_.erase({next->second.bytes, next->first});
    size += next->second.bytes;
    free_by_address_.erase(next);
  }
  auto before = free_by_address_.lower_bound(at);
  if (before != free_by_address_.begin()) {
    --before;
    if (before->first + before->second.bytes == at && before->second.chunk_end == chunk_end) {
      free_by_size_.erase({before->second.bytes, before->first});
      at = before->first;
      size += before->second.bytes;
      free_by_address_.erase(before);
    }
  }
  add_free(at, size, chunk_end);
}

std::size_t BlockArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mapped_;
}

std::size_t BlockArena::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_bytes_;
}

}  // namespace partrain
