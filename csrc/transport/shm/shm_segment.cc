#include "transport/shm/shm_segment.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "core/errors.h"

namespace pyring {

namespace {
constexpr uint64_t kMagic = 0x7079726e67736d33ULL;  // "pyrngsm3"
constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

size_t stride_for(uint32_t nslots, uint64_t slot_bytes) {
  return round_up(sizeof(InboxControl) + static_cast<size_t>(nslots) * slot_bytes, kPage);
}
}  // namespace

size_t ShmSegment::size_for(uint32_t local_world, uint32_t nslots, uint64_t slot_bytes) {
  return round_up(sizeof(SegmentHeader), kPage) + local_world * stride_for(nslots, slot_bytes);
}

ShmSegment::ShmSegment(void* base, size_t size) : base_(base), size_(size) {}

ShmSegment::~ShmSegment() {
  munmap(base_, size_);
}

size_t ShmSegment::inbox_stride() const {
  return stride_for(header()->nslots, header()->slot_bytes);
}

InboxControl* ShmSegment::inbox_control(uint32_t from) const {
  auto* p =
      static_cast<uint8_t*>(base_) + round_up(sizeof(SegmentHeader), kPage) + from * inbox_stride();
  return reinterpret_cast<InboxControl*>(p);
}

uint8_t* ShmSegment::inbox_slot(uint32_t from, uint32_t slot) const {
  return reinterpret_cast<uint8_t*>(inbox_control(from)) + sizeof(InboxControl) +
         static_cast<size_t>(slot) * header()->slot_bytes;
}

std::shared_ptr<ShmSegment> ShmSegment::create(SharedFile& file, uint32_t local_world,
                                               uint32_t nslots, uint64_t slot_bytes) {
  PYRING_CHECK_ARG(nslots >= 2 && nslots <= kMaxSlots, "shm slot count ", nslots,
                   " out of range [2, ", kMaxSlots, "]");
  PYRING_CHECK_ARG(slot_bytes >= 8 && slot_bytes % 8 == 0 && slot_bytes <= UINT32_MAX,
                   "shm slot size ", slot_bytes, " must be a positive multiple of 8 below 4 GiB");
  const size_t size = size_for(local_world, nslots, slot_bytes);
  void* base = file.map(size);
  auto* h = new (base) SegmentHeader;
  h->local_world = local_world;
  h->nslots = nslots;
  h->slot_bytes = slot_bytes;
  h->pid = getpid();
  h->sleeping.store(0);
  h->closed.store(0);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return std::shared_ptr<ShmSegment>(new ShmSegment(base, size));
}

std::shared_ptr<ShmSegment> ShmSegment::attach(int peer, const std::string& address,
                                               uint32_t local_world, uint32_t nslots,
                                               uint64_t slot_bytes) {
  const std::string what = str_cat("rank ", peer, "'s shared-memory segment");
  const size_t size = size_for(local_world, nslots, slot_bytes);
  // A size other than this rank's geometry fails here: the peers disagree on segment_bytes
  // or the local world (init checks both first).
  void* base = map_shared_file(what, SharedFileId::parse(address), size);
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment(base, size));
  auto* h = seg->header();
  PYRING_CHECK(h->magic == kMagic && h->nslots == nslots && h->slot_bytes == slot_bytes, CommError,
               what, " has an unexpected layout");
  return seg;
}

}  // namespace pyring
