// Everything of chorus_comm's public API.
#pragma once

#include "chorus/communicator.h"
#include "chorus/defaults.h"
#include "chorus/error.h"
#include "chorus/shared_memory.h"
#include "chorus/store.h"
#include "chorus/topology.h"
#include "chorus/types.h"
#include "chorus/version.h"
#include "chorus/work.h"
