// See include/magpie_guard.h. Magpie's only C source: the SIGBUS handler, its chaining, and the
// thread-local jump point live here and nowhere else.
#define _GNU_SOURCE
#include "magpie_guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

/// The handler that was installed before ours; written once, inside pthread_once, before any guarded
/// copy can run (the handler only reads it).
static struct sigaction previous_action;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_result = -1;

/// Non-null while this thread is inside `magpie_guarded_copy`. Touched by this thread before it can
/// fault, so the handler's access never allocates the thread-local block.
static _Thread_local sigjmp_buf *volatile current_jump = NULL;

static void forward(int signal_number, siginfo_t *info, void *context) {
    if (previous_action.sa_flags & SA_SIGINFO) {
        if (previous_action.sa_sigaction != NULL) {
            previous_action.sa_sigaction(signal_number, info, context);
            return;
        }
    } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
        previous_action.sa_handler(signal_number);
        return;
    }
    // No handler before ours (ignoring a fault is not possible: treat SIG_IGN as the default). Restore
    // the default action and raise again: the process ends as it would have without Magpie, core and all.
    struct sigaction fallback;
    memset(&fallback, 0, sizeof fallback);
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(signal_number, &fallback, NULL);
    raise(signal_number);
}

static void on_sigbus(int signal_number, siginfo_t *info, void *context) {
    sigjmp_buf *jump = current_jump;
    if (jump != NULL && info != NULL && info->si_code > 0) {  // a fault of this thread, not a kill(2)
        current_jump = NULL;
        // SA_NODEFER left SIGBUS unblocked, so jumping without restoring the mask is correct.
        siglongjmp(*jump, 1);
    }
    forward(signal_number, info, context);
}

static void install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    install_result = sigaction(SIGBUS, &action, &previous_action) == 0 ? 0 : -1;
}

int magpie_guard_install(void) {
    pthread_once(&install_once, install);
    return install_result;
}

int magpie_guarded_copy(void *destination, const void *source, size_t count) {
    sigjmp_buf jump;
    // savemask 0: no sigprocmask system call per copy (see on_sigbus for why that is safe).
    if (sigsetjmp(jump, 0) != 0) {
        return -1;  // current_jump was cleared by the handler
    }
    current_jump = &jump;
    memcpy(destination, source, count);
    current_jump = NULL;
    return 0;
}
