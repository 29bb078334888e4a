/* Table-driven tests of the router: the gateway's table (method + path → handler and metrics
 * label, 404, 405 with Allow) and the pattern matcher on a table of its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/admin.h"
#include "idemgate/console.h"
#include "idemgate/intake.h"
#include "idemgate/jobs.h"
#include "idemgate/metrics.h"
#include "idemgate/routes.h"
#include "idemgate/webhooks.h"

struct gw_case {
    const char *method, *path;
    enum route_result want;
    route_fn handler;  /* FOUND */
    int label;         /* FOUND and BAD_METHOD */
    const char *arg0;  /* the first {arg}, or NULL */
    const char *tail;  /* the "*" capture, or NULL */
    const char *allow; /* BAD_METHOD */
};

static const struct gw_case gw_cases[] = {
    {"POST", "/v1/providers/openai/images/generations", ROUTE_FOUND, intake_handle, MR_INTAKE, NULL,
     "openai/images/generations", NULL},
    {"POST", "/v1/providers/", ROUTE_FOUND, intake_handle, MR_INTAKE, NULL, "", NULL},
    {"GET", "/v1/providers/openai/x", ROUTE_BAD_METHOD, NULL, MR_INTAKE, NULL, NULL, "POST"},
    {"GET", "/v1/jobs", ROUTE_FOUND, jobs_list, MR_JOB_LIST, NULL, NULL, NULL},
    {"POST", "/v1/jobs", ROUTE_BAD_METHOD, NULL, MR_JOB_LIST, NULL, NULL, "GET, HEAD"},
    {"HEAD", "/v1/jobs", ROUTE_FOUND, jobs_list, MR_JOB_LIST, NULL, NULL, NULL},
    {"GET", "/v1/jobs/job_1", ROUTE_FOUND, jobs_get, MR_JOB_GET, "job_1", NULL, NULL},
    {"GET", "/v1/jobs/", ROUTE_FOUND, jobs_get, MR_JOB_GET, "", NULL, NULL},
    {"DELETE", "/v1/jobs/job_1", ROUTE_BAD_METHOD, NULL, MR_JOB_GET, NULL, NULL, "GET, HEAD"},
    {"POST", "/v1/jobs/job_1/resolve", ROUTE_FOUND, jobs_resolve, MR_RESOLVE, "job_1", NULL, NULL},
    {"POST", "/v1/jobs/job_1/cancel", ROUTE_FOUND, jobs_cancel, MR_CANCEL, "job_1", NULL, NULL},
    {"POST", "/v1/jobs/job_1/regenerate", ROUTE_FOUND, jobs_regenerate, MR_REGENERATE, "job_1",
     NULL, NULL},
    {"GET", "/v1/jobs/job_1/cancel", ROUTE_BAD_METHOD, NULL, MR_CANCEL, NULL, NULL, "POST"},
    {"POST", "/v1/jobs/job_1/bogus", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"POST", "/v1/jobs/job_1/cancel/x", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"POST", "/v1/admin/providers/openai/reset", ROUTE_FOUND, admin_reset, MR_ADMIN, "openai", NULL,
     NULL},
    {"POST", "/v1/admin/jobs/job_1/resume", ROUTE_FOUND, admin_resume, MR_ADMIN, "job_1", NULL,
     NULL},
    {"GET", "/v1/admin/jobs/job_1/resume", ROUTE_BAD_METHOD, NULL, MR_ADMIN, NULL, NULL, "POST"},
    {"GET", "/v1/admin/jobs", ROUTE_FOUND, admin_jobs_list, MR_ADMIN, NULL, NULL, NULL},
    {"GET", "/v1/admin/jobs/job_1", ROUTE_FOUND, admin_job_get, MR_ADMIN, "job_1", NULL, NULL},
    {"POST", "/v1/admin/jobs/job_1", ROUTE_BAD_METHOD, NULL, MR_ADMIN, NULL, NULL, "GET, HEAD"},
    {"GET", "/v1/admin/providers", ROUTE_FOUND, admin_providers, MR_ADMIN, NULL, NULL, NULL},
    {"GET", "/console", ROUTE_FOUND, console_page, MR_CONSOLE, NULL, NULL, NULL},
    {"GET", "/console/app.js", ROUTE_FOUND, console_asset, MR_CONSOLE, "app.js", NULL, NULL},
    {"POST", "/console", ROUTE_BAD_METHOD, NULL, MR_CONSOLE, NULL, NULL, "GET, HEAD"},
    {"GET", "/console/x/y", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"POST", "/v1/admin/providers/openai/resume", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"POST", "/v1/admin/providers/openai", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"POST", "/v1/webhooks/replicate", ROUTE_FOUND, webhooks_receive, MR_WEBHOOK, NULL, "replicate",
     NULL},
    {"PUT", "/v1/webhooks/replicate", ROUTE_BAD_METHOD, NULL, MR_WEBHOOK, NULL, NULL, "POST"},
    {"GET", "/metrics", ROUTE_FOUND, admin_metrics, MR_METRICS, NULL, NULL, NULL},
    {"POST", "/metrics", ROUTE_BAD_METHOD, NULL, MR_METRICS, NULL, NULL, "GET, HEAD"},
    {"GET", "/healthz", ROUTE_FOUND, admin_health, MR_HEALTH, NULL, NULL, NULL},
    {"HEAD", "/healthz", ROUTE_FOUND, admin_health, MR_HEALTH, NULL, NULL, NULL},
    {"FOO", "/healthz", ROUTE_BAD_METHOD, NULL, MR_HEALTH, NULL, NULL, "GET, HEAD"},
    {"HEAD", "/readyz", ROUTE_FOUND, admin_ready, MR_READY, NULL, NULL, NULL},
    {"HEAD", "/v1/providers/openai/x", ROUTE_BAD_METHOD, NULL, MR_INTAKE, NULL, NULL, "POST"},
    {"GET", "/", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"GET", "/nope", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"GET", "/metrics/x", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
    {"GET", "/v1/jobsx", ROUTE_NOT_FOUND, NULL, 0, NULL, NULL, NULL},
};

static void test_gateway_table(void **state)
{
    (void)state;
    size_t n;
    const struct route *t = routes_table(&n);
    for (size_t i = 0; i < sizeof(gw_cases) / sizeof(gw_cases[0]); i++) {
        const struct gw_case *c = &gw_cases[i];
        struct route_match m;
        char arg[64];
        print_message("%s %s\n", c->method, c->path);
        assert_int_equal(route_match(t, n, c->method, c->path, &m), c->want);
        if (c->want == ROUTE_NOT_FOUND) {
            assert_null(m.route);
            continue;
        }
        assert_int_equal(m.route->label, c->label);
        if (c->want == ROUTE_BAD_METHOD) {
            assert_string_equal(m.allow, c->allow);
            continue;
        }
        assert_ptr_equal(m.route->handler, c->handler);
        if (c->arg0) {
            assert_true(api_arg(&m.args, 0, arg, sizeof(arg)) >= 0);
            assert_string_equal(arg, c->arg0);
        }
        if (c->tail)
            assert_string_equal(m.args.tail, c->tail);
        else
            assert_null(m.args.tail);
    }
}

static void h_a(struct hs_req *r, const struct api_args *a)
{
    (void)r;
    (void)a;
}

static void h_b(struct hs_req *r, const struct api_args *a)
{
    (void)r;
    (void)a;
}

/* One path, several methods: 405 names them all, once each, in table order. */
static const struct route multi[] = {
    {"GET", "/x/{a}/{b}", 1, h_a, 0},
    {"PUT", "/x/{a}/{b}", 2, h_b, 0},
    {"GET", "/x/{a}/{b}", 3, h_b, 0},
    {"DELETE", "/x/{a}/*", 4, h_a, 0},
};

static void test_matcher(void **state)
{
    (void)state;
    struct route_match m;
    char a[8];
    const size_t n = sizeof(multi) / sizeof(multi[0]);
    assert_int_equal(route_match(multi, n, "POST", "/x/1/2", &m), ROUTE_BAD_METHOD);
    assert_string_equal(m.allow, "GET, HEAD, PUT, DELETE");
    assert_int_equal(m.route->label, 1);
    assert_int_equal(route_match(multi, n, "GET", "/x/1/2", &m), ROUTE_FOUND);
    assert_int_equal(m.route->label, 1); /* the first entry wins */
    assert_int_equal(m.args.n, 2);
    assert_int_equal(api_arg(&m.args, 1, a, sizeof(a)), 1);
    assert_string_equal(a, "2");
    assert_int_equal(api_arg(&m.args, 2, a, sizeof(a)), -1); /* no such argument */
    assert_int_equal(route_match(multi, n, "PUT", "/x/1/2", &m), ROUTE_FOUND);
    assert_ptr_equal(m.route->handler, h_b);
    assert_int_equal(route_match(multi, n, "DELETE", "/x/1/2/3", &m), ROUTE_FOUND);
    assert_string_equal(m.args.tail, "2/3");
    assert_int_equal(route_match(multi, n, "GET", "/x/1/2/3", &m), ROUTE_BAD_METHOD);
    assert_string_equal(m.allow, "DELETE");
    assert_int_equal(route_match(multi, n, "GET", "/x/1", &m), ROUTE_NOT_FOUND);
    /* An argument longer than the caller's buffer is refused, not cut. */
    assert_int_equal(route_match(multi, n, "GET", "/x/12345678/2", &m), ROUTE_FOUND);
    assert_int_equal(api_arg(&m.args, 0, a, sizeof(a)), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gateway_table),
        cmocka_unit_test(test_matcher),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
