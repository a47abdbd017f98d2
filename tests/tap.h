/* A tiny TAP producer for C unit tests, read by prove. Header-only; one test program each. */
#ifndef CKPTFS_TESTS_TAP_H
#define CKPTFS_TESTS_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_count;
static int tap_failed;

static inline bool tap_ok(bool cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", cond ? "ok" : "not ok", ++tap_count);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (!cond) {
        tap_failed++;
        /* On stderr, as tap_diag: prove shows it without -v, so CI logs say what failed. */
        va_start(ap, fmt);
        fprintf(stderr, "#   Failed test %d - ", tap_count);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
    }
    return cond;
}

/* N tests skipped, for the reason FMT. */
static inline void tap_skip(int n, const char *fmt, ...)
{
    for (int i = 0; i < n; i++) {
        va_list ap;
        va_start(ap, fmt);
        printf("ok %d # skip ", ++tap_count);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
    fflush(stdout);
}

/* Why something failed: on stderr, which prove always shows (stdout comments only with -v). */
static inline void tap_diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "# ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* A note: on stdout, shown by prove -v. */
static inline void tap_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

#define tap_is_u64(got, want, ...)                                                            \
    do {                                                                                      \
        unsigned long long got_ = (unsigned long long)(got);                                  \
        unsigned long long want_ = (unsigned long long)(want);                                \
        if (!tap_ok(got_ == want_, __VA_ARGS__))                                              \
            tap_diag("  got %llu, want %llu", got_, want_);                                   \
    } while (0)

/* Prints the plan at the end ("done testing") and returns the exit status. */
static inline int tap_done(void)
{
    printf("1..%d\n", tap_count);
    return tap_failed ? 1 : 0;
}

#endif
