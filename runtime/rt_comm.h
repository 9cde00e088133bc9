/* rt_comm.h: the data-parallel transport (rt_comm.c), as the rest of the
 * runtime sees it.  Process-wide: one world per process. */
#ifndef NOVA_RT_COMM_H
#define NOVA_RT_COMM_H

#include <stddef.h>

/* Joins the launcher's world (MPI) once per process; a process not
 * started by a launcher is a world of one.  -1 with the reason in ERR. */
int rt_comm_init(char *err, size_t errlen);
/* The number of ranks (1 before rt_comm_init or in a world of one); *RANK
 * this process's. */
int rt_comm_world(int *rank);
/* A run of a data-parallel step finished (the step number in messages). */
void rt_comm_step_done(void);
/* V[0..N) summed over the ranks, in place (blocking; every rank calls it). */
int rt_comm_sum(double *v, int n, char *err, size_t errlen);
/* Each rank's BYTES from MINE, in rank order, into ALL (size * BYTES). */
int rt_comm_allgather(const void *mine, size_t bytes, void *all, char *err, size_t errlen);

#endif
