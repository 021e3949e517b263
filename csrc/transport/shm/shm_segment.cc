#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <new>

#include "core/errors.h"

namespace pyring {

namespace {
constexpr uint64_t kMagic = 0x7079726e67736d32ULL;  // "pyrngsm2"
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

ShmSegment::ShmSegment(std::string name, void* base, size_t size)
    : name_(std::move(name)), base_(base), size_(size) {}

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

std::shared_ptr<ShmSegment> ShmSegment::create(const std::string& name, uint32_t local_world,
                                               uint32_t nslots, uint64_t slot_bytes) {
  PYRING_CHECK_ARG(nslots >= 2 && nslots <= kMaxSlots, "shm slot count ", nslots,
                   " out of range [2, ", kMaxSlots, "]");
  PYRING_CHECK_ARG(slot_bytes >= 8 && slot_bytes % 8 == 0 && slot_bytes <= UINT32_MAX,
                   "shm slot size ", slot_bytes, " must be a positive multiple of 8 below 4 GiB");
  size_t size = size_for(local_world, nslots, slot_bytes);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  PYRING_CHECK_ERRNO(fd >= 0, "shm_open(", name, ") failed");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    PYRING_THROW(CommError, "ftruncate(", name, ", ", size, " bytes) failed: ", strerror(err),
                 " (is /dev/shm large enough?)");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    PYRING_THROW(CommError, "mmap(", name, ", ", size, " bytes) failed: ", strerror(err));
  }
  auto* h = new (base) SegmentHeader;
  h->local_world = local_world;
  h->nslots = nslots;
  h->slot_bytes = slot_bytes;
  h->pid = getpid();
  h->sleeping.store(0);
  h->aborted.store(0);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return std::shared_ptr<ShmSegment>(new ShmSegment(name, base, size));
}

std::shared_ptr<ShmSegment> ShmSegment::attach(const std::string& name, uint32_t local_world,
                                               uint32_t nslots, uint64_t slot_bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  PYRING_CHECK_ERRNO(fd >= 0, "shm_open(", name, ") of a local peer failed");
  size_t size = size_for(local_world, nslots, slot_bytes);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size) {
    close(fd);
    PYRING_THROW(CommError, "shared-memory segment ", name, " has ", st.st_size,
                 " bytes, expected ", size, " (peers disagree on segment_bytes or local world)");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  PYRING_CHECK(base != MAP_FAILED, CommError, "mmap(", name, ") failed: ", strerror(err));
  auto seg = std::shared_ptr<ShmSegment>(new ShmSegment(name, base, size));
  auto* h = seg->header();
  PYRING_CHECK(h->magic == kMagic && h->nslots == nslots && h->slot_bytes == slot_bytes, CommError,
               "shared-memory segment ", name, " has an unexpected layout");
  return seg;
}

void ShmSegment::unlink(const std::string& name) {
  shm_unlink(name.c_str());
}

}  // namespace pyring
