// Everything of chorus_comm's public API.
#pragma once

#include "chorus/communicator.h"
#include "chorus/error.h"
#include "chorus/store.h"
#include "chorus/types.h"
#include "chorus/version.h"
#include "chorus/work.h"
