// The Compose stack's S3-compatible archive server: s3rver (pinned by package-lock.json beside
// this file) with one bucket and the key pair from the environment — S3_ACCESS_KEY_ID and
// S3_SECRET_ACCESS_KEY, from the git-ignored docker/s3.env — in place of s3rver's built-in
// dummy pair, which is revoked. A demonstration server, like the mock provider: in production
// point archive_s3_endpoint at the object store you run (S3, R2, GCS XML, MinIO, Ceph RGW…).
'use strict';
const S3rver = require('s3rver');
const AWSAccount = require('s3rver/lib/models/account');

const id = process.env.S3_ACCESS_KEY_ID;
const secret = process.env.S3_SECRET_ACCESS_KEY;
if (!id || !secret) {
  console.error('s3: S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY are required');
  process.exit(1);
}
AWSAccount.DUMMY_ACCOUNT.revokeAccessKey('S3RVER');
AWSAccount.DUMMY_ACCOUNT.createKeyPair(id, secret);

new S3rver({
  address: process.env.S3_ADDRESS || '0.0.0.0',
  port: Number(process.env.S3_PORT || 9000),
  directory: process.env.S3_DIRECTORY || '/data',
  configureBuckets: [{ name: process.env.S3_BUCKET || 'archive', configs: [] }],
})
  .run()
  .then(({ address, port }) => console.log(`s3 listening on ${address}:${port}`))
  .catch((err) => {
    console.error(err);
    process.exit(1);
  });
