// Blocking until links can move bytes again.
#pragma once

#include <cstddef>

#include "core/link.h"

namespace pyring {

// Blocks for at most `max_ms` until one of `links` may make progress or a peer wakes this rank.
// Sockets are polled; shm links sleep on this rank's futex word after a final progress check,
// so that a wake-up between the check and the sleep is not lost. With both kinds present the
// sleep is capped at 1 ms. With a link of neither kind (device work) it sleeps 20 us. May call
// progress() on the links; returns true if that moved bytes.
bool wait_for_links(Link* const* links, size_t n, int max_ms);

}  // namespace pyring
