import type { DeliveryFeedback } from '../outcomes/provider-events.js';

/**
 * Amazon SES notifications, the `Message` of an SNS Notification (docs/outcomes.md). Both
 * shapes SES publishes are read: feedback notifications (`notificationType`) and event
 * publishing through a configuration set (`eventType`). Bounce: Permanent = hard,
 * Transient (and Undetermined) = soft; Complaint, unless its `complaintFeedbackType` (the ISP's
 * ARF Feedback-Type) is one other than `abuse`, as a report by mail (`not-spam`: the recipient
 * says it is not spam); Delivery; DeliveryDelay.
 */
interface SesMail {
  messageId?: string;
  headers?: { name?: string; value?: string }[];
  commonHeaders?: { messageId?: string };
}
interface SesNotification {
  notificationType?: string;
  eventType?: string;
  mail?: SesMail;
  bounce?: { bounceType?: string; bounceSubType?: string; bouncedRecipients?: { emailAddress?: string; diagnosticCode?: string; status?: string }[] };
  deliveryDelay?: { delayType?: string; delayedRecipients?: { emailAddress?: string; diagnosticCode?: string }[] };
  /** `complaintFeedbackType`: the ISP's ARF `Feedback-Type`, when it sent one. */
  complaint?: { complaintFeedbackType?: string; complainedRecipients?: { emailAddress?: string }[] };
  delivery?: { recipients?: unknown[] };
}

/**
 * One event for each recipient a notification lists (the email's `to` or a copy: the recorder
 * tells them apart), or one about the `to` when it lists none.
 */
function perRecipient<T extends { emailAddress?: string }>(recipients: T[] | undefined, event: (recipient: T | undefined) => DeliveryFeedback): DeliveryFeedback[] {
  const listed = Array.isArray(recipients) ? recipients.filter((r) => r && typeof r === 'object') : [];
  if (listed.length === 0) return [event(undefined)];
  return listed.map((r) => ({ ...event(r), ...(typeof r.emailAddress === 'string' ? { recipient: r.emailAddress } : {}) }));
}

/** The Message-ID the sender set, when SES kept the original headers. */
function originalMessageId(mail: SesMail): string | undefined {
  const header = mail.headers?.find((h) => h.name?.toLowerCase() === 'message-id')?.value;
  return header ?? mail.commonHeaders?.messageId;
}

export function sesFeedback(message: string): DeliveryFeedback[] {
  let notification: SesNotification;
  try {
    notification = JSON.parse(message) as SesNotification;
  } catch {
    // A notification that is not an SES event (a test message published to the topic).
    return [];
  }
  if (!notification || typeof notification !== 'object' || !notification.mail) return [];
  const kind = notification.notificationType ?? notification.eventType;
  const match = { messageId: originalMessageId(notification.mail), providerMessageId: notification.mail.messageId };
  switch (kind) {
    case 'Bounce': {
      const bounceType = notification.bounce?.bounceType === 'Permanent' ? 'hard' : 'soft';
      return perRecipient(notification.bounce?.bouncedRecipients, (r) => ({
        type: 'bounced',
        ...match,
        bounceType,
        diagnostic: r?.diagnosticCode ?? r?.status ?? notification.bounce?.bounceSubType,
      }));
    }
    case 'Complaint': {
      const feedbackType = notification.complaint?.complaintFeedbackType?.toLowerCase();
      return feedbackType === undefined || feedbackType === 'abuse' ? perRecipient(notification.complaint?.complainedRecipients, () => ({ type: 'complained', ...match })) : [];
    }
    case 'Delivery': {
      const recipients = notification.delivery?.recipients?.filter((r): r is string => typeof r === 'string').map((emailAddress) => ({ emailAddress }));
      return perRecipient(recipients, () => ({ type: 'delivered', ...match }));
    }
    case 'DeliveryDelay':
      return perRecipient(notification.deliveryDelay?.delayedRecipients, (r) => ({
        type: 'delivery_delayed',
        ...match,
        diagnostic: r?.diagnosticCode ?? notification.deliveryDelay?.delayType,
      }));
    default:
      return [];
  }
}
