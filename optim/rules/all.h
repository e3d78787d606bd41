#pragma once
// Every optimizer's rule, for the code that expands KILN_OPTIMIZERS (optim/optimizer_options.h).

#include "optim/rules/adamw.h"
#include "optim/rules/lamb.h"
#include "optim/rules/sgd.h"
