#include "core/device_queue.h"

#include <algorithm>

#include "core/errors.h"

namespace pyring {

DeviceQueue::DeviceQueue(Device device)
    : device_(device),
      rt_(device_runtime(device.kind)),
      pinned_arena_(ScratchArena::Kind::kPinned, &rt_, device.index,
                    [this](uint8_t* p) { retire(p, true); }),
      device_arena_(ScratchArena::Kind::kDevice, &rt_, device.index,
                    [this](uint8_t* p) { retire(p, false); }) {
  PYRING_CHECK_ARG(!device.is_cpu(), "a device queue needs a device, not the host");
  rt_.require_stream_flags(device_.index);
  flags_ = static_cast<Flag*>(rt_.alloc_host(device_.index, (2 * kSlots + 1) * sizeof(Flag)));
  for (size_t i = 0; i < 2 * kSlots + 1; ++i) new (&flags_[i]) Flag(0);
  entered_ = flags_;
  done_ = flags_ + kSlots;
  copied_ = flags_ + 2 * kSlots;
  try {
    stream_ = rt_.create_stream(device_.index);
  } catch (...) {
    rt_.free_host(device_.index, flags_);
    throw;
  }
}

DeviceQueue::~DeviceQueue() {
  try {
    rt_.synchronize(device_.index, stream_);
  } catch (const std::exception&) {  // the device failed: free what can be freed
  }
  rt_.destroy_stream(device_.index, stream_);
  free_retired(true);
  if (staging_) rt_.free_host(device_.index, staging_);
  if (scratch_) device_free(rt_, device_.index, scratch_);
  rt_.free_host(device_.index, flags_);
}

uint64_t DeviceQueue::enter(StreamId stream, Deadline deadline) {
  free_retired(false);
  const uint64_t ticket = next_ticket_.fetch_add(1) + 1;
  try {
    if (ticket > kSlots) {
      wait_done(ticket - kSlots, deadline);  // its slots are about to be reused
    }
    callers_[ticket % kSlots] = stream;
    rt_.write_flag(device_.index, stream, &slot(entered_, ticket), ticket);
  } catch (...) {
    raise_flag(slot(done_, ticket), ticket);  // no later ticket waits for this one
    throw;
  }
  return ticket;
}

uint8_t* DeviceQueue::grow(uint8_t*& p, size_t& capacity, size_t bytes, bool host) {
  if (bytes <= capacity) return p;
  // Earlier collectives' copies and kernels may still use the old memory: it is retired, and
  // the new size at least doubles, so that what waits to be freed stays below what is held.
  if (p) retire(p, host);
  p = nullptr;
  bytes = std::max(bytes, 2 * capacity);
  capacity = 0;
  p = static_cast<uint8_t*>(host ? rt_.alloc_host(device_.index, bytes)
                                 : device_alloc(rt_, device_.index, bytes));
  capacity = bytes;
  return p;
}

uint8_t* DeviceQueue::staging(size_t bytes) {
  return grow(staging_, staging_bytes_, bytes, true);
}

uint8_t* DeviceQueue::device_scratch(size_t bytes) {
  return grow(scratch_, scratch_bytes_, bytes, false);
}

void DeviceQueue::run_resident(uint64_t ticket, const std::function<void(Deadline)>& fn,
                               Deadline deadline) {
  serve(ticket, deadline, [&] { fn(deadline); });
}

void DeviceQueue::serve(uint64_t ticket, Deadline deadline, const std::function<void()>& body) {
  try {
    host_wait_flag(&slot(entered_, ticket), ticket, deadline,
                   "the work queued on the caller's stream before the collective",
                   StreamProbe{&rt_, device_, callers_[ticket % kSlots]});
    body();
    rt_.write_flag(device_.index, stream_, &slot(done_, ticket), ticket);
    raise_flag(done_queued_, ticket);
  } catch (...) {
    release(ticket);
    throw;
  }
}

void DeviceQueue::run(uint64_t ticket, const std::vector<StagedRegion>& regions,
                      const std::function<void(Deadline, uint8_t* const*)>& fn, Deadline deadline) {
  serve(ticket, deadline, [&] {
    size_t total = 0;
    for (const auto& r : regions) total += scratch_aligned(r.bytes);
    uint8_t* base = staging(total);
    std::vector<uint8_t*> host(regions.size());
    size_t off = 0;
    bool copies = false;
    for (size_t i = 0; i < regions.size(); ++i) {
      host[i] = base + off;
      off += scratch_aligned(regions[i].bytes);
      if (regions[i].read && regions[i].bytes > 0) {
        copy_async(host[i], regions[i].data, regions[i].bytes);
        copies = true;
      }
    }
    if (copies) {
      host_wait_flag(copied_, mark_copied(), deadline, "the copy of the inputs from the device",
                     own_stream());
    }
    fn(deadline, host.data());
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i].write && regions[i].bytes > 0) {
        copy_async(regions[i].data, host[i], regions[i].bytes);
      }
    }
  });
}

void DeviceQueue::copy_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  rt_.copy_async(device_.index, dst, src, bytes, stream_);
  host_device_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

uint64_t DeviceQueue::mark_copied() {
  rt_.write_flag(device_.index, stream_, copied_, ++copy_seq_);
  return copy_seq_;
}

void DeviceQueue::run_chunked(uint64_t ticket, const BufferView& in, const BufferView& out,
                              const std::function<void(Deadline, uint8_t*, size_t, size_t)>& fn,
                              Deadline deadline) {
  serve(ticket, deadline, [&] {
    const size_t esz = dtype_size(in.dtype), n = in.count;
    const size_t chunk = stage_chunk_elems(in.dtype);
    const size_t chunks = n == 0 ? 1 : (n + chunk - 1) / chunk;
    const size_t slot_bytes = scratch_aligned((n < chunk ? n : chunk) * esz);
    uint8_t* base = staging(chunks > 1 ? 2 * slot_bytes : slot_bytes);
    auto count_of = [&](size_t k) { return k * chunk + chunk <= n ? chunk : n - k * chunk; };
    auto slot_of = [&](size_t k) { return base + (k % 2) * slot_bytes; };
    // Chunk k+1's copy in is queued after chunk k-1's copy back, which read the same slot.
    auto copy_in = [&](size_t k) {
      if (count_of(k) > 0) {
        copy_async(slot_of(k), in.at(k * chunk), count_of(k) * esz);
      }
      return mark_copied();
    };
    uint64_t next = copy_in(0);
    for (size_t k = 0; k < chunks; ++k) {
      host_wait_flag(copied_, next, deadline, "the copy of the inputs from the device",
                     own_stream());
      if (k + 1 < chunks) next = copy_in(k + 1);
      fn(deadline, slot_of(k), k * chunk, count_of(k));
      if (count_of(k) > 0) {
        copy_async(out.at(k * chunk), slot_of(k), count_of(k) * esz);
      }
    }
  });
}

void DeviceQueue::retire(void* p, bool host) {
  std::lock_guard<std::mutex> lock(retired_mu_);
  retired_.push_back(Retired{p, host ? Freed::kHost : Freed::kDevice});
}

void DeviceQueue::retire_mapping(void* p) {
  std::lock_guard<std::mutex> lock(retired_mu_);
  retired_.push_back(Retired{p, Freed::kMapping});
}

void DeviceQueue::drain(Deadline deadline, const char* what) {
  host_wait_flag(copied_, mark_copied(), deadline, what, own_stream());
}

void DeviceQueue::free_retired(bool all) noexcept {
  std::vector<Retired> now;
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    if (retired_.empty()) return;
    // Tickets finish in order: the newest entered ticket done means every earlier one is.
    const uint64_t last = next_ticket_.load();
    if (!all && last > 0 && !done(last)) return;
    now.swap(retired_);
  }
  for (const Retired& r : now) {
    switch (r.how) {
      case Freed::kHost:
        rt_.free_host(device_.index, r.p);
        break;
      case Freed::kDevice:
        device_free(rt_, device_.index, r.p);
        break;
      case Freed::kMapping:
        rt_.ipc_close(device_.index, r.p);
        break;
    }
  }
}

void DeviceQueue::release(uint64_t ticket) noexcept {
  try {
    rt_.synchronize(device_.index, stream_);
  } catch (const std::exception&) {  // the stream is broken: nothing of it will write the flag
  }
  raise_flag(slot(done_, ticket), ticket);
  raise_flag(done_queued_, ticket);
}

void DeviceQueue::order_after(StreamId stream, uint64_t ticket) {
  // Tickets are served in order: the latest one queued covers every earlier one.
  PYRING_CHECK(done_queued_.load() >= ticket, CommError, "device collective #", ticket, " on ",
               device_.str(),
               " has not queued its results yet: a stream may wait for it only after its host "
               "part has ended (wait for the work on the host first)");
  rt_.wait_flag(device_.index, stream, &slot(done_, ticket), ticket);
}

bool DeviceQueue::done(uint64_t ticket) const {
  return slot(done_, ticket).load(std::memory_order_acquire) >= ticket;
}

void DeviceQueue::wait_done(uint64_t ticket, Deadline deadline) const {
  host_wait_flag(&slot(done_, ticket), ticket, deadline, "the collective's results on the device",
                 own_stream());
}

}  // namespace pyring
